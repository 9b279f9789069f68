/* test_denormals.c — the CPU's optimizer updates flush subnormal floats to zero
 * (src/backend/cpu/cpu_denormals.h), and leave the calling thread's floating-point mode as it was.
 *
 * - A moment below the normal range (what a moment whose gradient stays 0 decays into) comes out
 *   of AdamW's update, LAMB's direction and SGD's momentum as exactly 0, not as a smaller
 *   subnormal; the normal values beside it come out as the body (the formula the CUDA kernels
 *   run) gives them, bit for bit.
 * - A parameter the subnormal moment would have moved (one at exactly 0) stays 0.
 * - After each update the caller still computes with subnormals: the mode was restored.
 * Where the platform has no flush mode (neither x86's MXCSR nor AArch64's FPCR) the test says so
 * and checks only the last point. That the flush makes the update fast again is a measurement
 * (docs/PERFORMANCE.md), not a test. */
#include <float.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/body/optim.h"
#include "check.h"

#if defined(__SSE__) || defined(__aarch64__)
#define FLUSHES 1
#else
#define FLUSHES 0
#endif

static crew_backend be;

/* A subnormal the compiler cannot fold away: still one after arithmetic in the caller's mode. */
static int caller_keeps_subnormals(void)
{
    volatile float tiny = FLT_MIN, half = 0.5f;
    float r = tiny * half;
    return r != 0.0f && r < FLT_MIN;
}

static void check_adamw(void)
{
    const crew_adamw_consts k = {1.0f, 0.1f, 0.999f, 0.001f, 0.01f, 0.0447f, 1e-8f};
    /* [0] a decayed moment, gradient 0, parameter 0; [1] ordinary values */
    float p[2] = {0.0f, 0.5f}, g[2] = {0.0f, 0.02f}, m[2] = {FLT_MIN / 64, 0.01f}, v[2] = {1e-30f, 1e-4f};
    float ep[2], em[2], ev[2];
    memcpy(ep, p, sizeof p), memcpy(em, m, sizeof m), memcpy(ev, v, sizeof v);
    be.ops->adamw_update(be.ctx, p, g, m, v, 2, &k);
    crew_body_adamw(ep, g, em, ev, k, 1);
    CHECK_MSG(p[1] == ep[1] && m[1] == em[1] && v[1] == ev[1], "adamw: ordinary values differ from the body's");
    if (FLUSHES) {
        CHECK_MSG(m[0] == 0.0f, "adamw: a subnormal first moment came out as %g, not 0", (double)m[0]);
        CHECK_MSG(p[0] == 0.0f, "adamw: the parameter at 0 moved to %g by a subnormal moment", (double)p[0]);
    }
    CHECK_MSG(caller_keeps_subnormals(), "adamw_update left subnormals flushed in the calling thread");
}

static void check_adam_direction(void)
{
    const crew_adamw_consts k = {1.0f, 0.1f, 0.999f, 0.001f, 1.0f, 0.0447f, 1e-8f};
    float g[2] = {0.0f, 0.02f}, m[2] = {FLT_MIN / 8, 0.01f}, v[2] = {1e-30f, 1e-4f}, u[2];
    float em[2], ev[2], eu[2];
    memcpy(em, m, sizeof m), memcpy(ev, v, sizeof v);
    be.ops->adam_direction(be.ctx, g, m, v, u, 2, &k);
    crew_body_adam_direction(g, em, ev, eu, k, 1);
    CHECK_MSG(u[1] == eu[1] && m[1] == em[1] && v[1] == ev[1], "adam_direction: ordinary values differ from the body's");
    if (FLUSHES) CHECK_MSG(m[0] == 0.0f && u[0] == 0.0f, "adam_direction: m %g, u %g, not 0", (double)m[0], (double)u[0]);
    CHECK_MSG(caller_keeps_subnormals(), "adam_direction left subnormals flushed in the calling thread");
}

static void check_sgd(void)
{
    float p[2] = {0.0f, 0.5f}, g[2] = {0.0f, 0.02f}, vel[2] = {FLT_MIN / 4, 0.01f};
    float ep[2], evel[2];
    memcpy(ep, p, sizeof p), memcpy(evel, vel, sizeof vel);
    be.ops->sgd_update(be.ctx, p, g, vel, 2, 0.1f, 0.9f, 0, 0.0f);
    crew_body_sgd(ep, g, evel, 0.1f, 0.9f, 0, 0.0f, 1);
    CHECK_MSG(p[1] == ep[1] && vel[1] == evel[1], "sgd: ordinary values differ from the body's");
    if (FLUSHES)
        CHECK_MSG(vel[0] == 0.0f && p[0] == 0.0f, "sgd: velocity %g, parameter %g, not 0", (double)vel[0], (double)p[0]);
    CHECK_MSG(caller_keeps_subnormals(), "sgd_update left subnormals flushed in the calling thread");
}

int main(void)
{
    if (!FLUSHES) printf("this platform has no flush-to-zero mode crew sets: only the restored mode is checked\n");
    CHECK(caller_keeps_subnormals());
    CHECK_OK(crew_cpu_backend_create(1, &be));
    check_adamw();
    check_adam_direction();
    check_sgd();
    be.ops->destroy(be.ctx);
    return check_report();
}
