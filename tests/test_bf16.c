/* test_bf16.c — crew_bf16_round (core/bf16.h) against a reference worked out from the definition:
 * the nearest float whose low 16 bits are zero, ties to the one with an even 16th bit, beyond the
 * largest finite bfloat16 infinity, NaN a NaN. Edge cases by hand, then a million bit patterns. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "core/bf16.h"
#include "core/rng.h"

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* The definition: the two bfloat16 neighbours of |x| (the one below, and that plus one unit in
 * the last place, unbounded: past the largest finite it stands for infinity), the nearer one,
 * ties to the even one. Distances in double are exact here. */
static float reference(float x)
{
    if (isnan(x)) return x;
    uint32_t u = bits_of(x), lo = u & 0xffff0000u, hi = lo + 0x10000u;
    if (u == lo) return x;
    int e = (int)((lo >> 23) & 0xffu);
    double below = fabs((double)from_bits(lo)), ulp = ldexp(1.0, (e ? e : 1) - 127 - 7);
    double dl = fabs((double)x) - below, dh = below + ulp - fabs((double)x);
    if (dl != dh) return dl < dh ? from_bits(lo) : from_bits(hi);
    return (lo >> 16) & 1u ? from_bits(hi) : from_bits(lo);
}

static void check_one(float x)
{
    float got = crew_bf16_round(x), want = reference(x);
    if (isnan(want)) {
        CHECK_MSG(isnan(got), "round(%a) = %a, want NaN", (double)x, (double)got);
        return;
    }
    CHECK_MSG(bits_of(got) == bits_of(want), "round(%a) = %a (0x%08x), want %a (0x%08x)", (double)x, (double)got,
              bits_of(got), (double)want, bits_of(want));
}

int main(void)
{
    /* by hand: 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1); 1 + 3·2^-8 to 1 + 2^-6 */
    CHECK(crew_bf16_round(1.0f + 0x1p-8f) == 1.0f);
    CHECK(crew_bf16_round(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
    CHECK(crew_bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
    CHECK(crew_bf16_round(-1.0f - 0x1p-8f) == -1.0f);
    CHECK(crew_bf16_round(0.0f) == 0.0f && !signbit(crew_bf16_round(0.0f)));
    CHECK(signbit(crew_bf16_round(-0.0f)));
    CHECK(isinf(crew_bf16_round(INFINITY)) && crew_bf16_round(-INFINITY) < 0);
    CHECK(isinf(crew_bf16_round(3.4e38f)));          /* beyond bfloat16's largest, 3.3895e38 */
    CHECK(crew_bf16_round(from_bits(0x7f7f7fffu)) == from_bits(0x7f7f0000u)); /* just below the tie: the largest */
    CHECK(isnan(crew_bf16_round(NAN)));
    CHECK(isnan(crew_bf16_round(from_bits(0x7f800001u)))); /* a NaN whose payload is all in the low bits */
    CHECK(crew_bf16_round(0x1p-133f) == 0x1p-133f);  /* a subnormal with no low bits (0x00010000) */
    check_one(from_bits(0x00008000u));               /* subnormal ties */
    check_one(from_bits(0x00018000u));
    check_one(from_bits(0x7f7f8000u));               /* the tie above the largest finite: to infinity */
    check_one(from_bits(0x7f7f7fffu));
    for (uint64_t i = 0; i < 1000000; i++) check_one(from_bits((uint32_t)crew_rng_below(12345, i, (uint64_t)1 << 32)));
    return check_report();
}
