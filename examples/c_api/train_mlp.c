/* train_mlp.c — the Fashion-MNIST MLP through the public API alone.
 * usage: c_api_example DATA_DIR   (DATA_DIR from `crew prep fashion-mnist --out DATA_DIR`) */
#include <crew.h>
#include <stdio.h>

#define TRY(expr) do { crew_status s_ = (expr); if (s_) { fprintf(stderr, "%s\n", crew_status_message(s_)); \
                       crew_status_free(s_); return 2; } } while (0)

int main(int argc, char **argv)
{
    if (argc != 2) { fprintf(stderr, "usage: %s DATA_DIR\n", argv[0]); return 2; }
    crew_model *m;
    crew_dataset *train, *test;
    TRY(crew_dataset_open(argv[1], "train", &train));
    TRY(crew_dataset_open(argv[1], "test", &test));
    TRY(crew_model_create((int64_t[]){28, 28, 1}, 3, &m));
    TRY(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    TRY(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 256, .activation = CREW_ACT_RELU}));
    TRY(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 256, .activation = CREW_ACT_RELU}));
    TRY(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = 10}));
    TRY(crew_model_compile(m, &(crew_compile_options){
        .loss = CREW_LOSS_SOFTMAX_CROSS_ENTROPY,
        .optimizer = {.type = CREW_OPT_ADAMW, .lr = 1e-3f}}));
    crew_fit_options fit;
    crew_model_default_fit(m, &fit);
    fit.epochs = 2;
    fit.batch_per_device = 128;
    fit.devices = 2;              /* two replicas, data-parallel */
    fit.test = test;
    crew_fit_result r;
    TRY(crew_model_fit(m, train, &fit, &r));
    crew_eval_result e;
    TRY(crew_model_evaluate(m, test, 256, &e));
    printf("test accuracy %.4f (loss %.4f) after %lld steps, %.0f samples/s\n", (double)e.accuracy,
           (double)e.loss, (long long)r.steps, r.samples_per_s);
    TRY(crew_model_save_weights(m, "fashion_mlp.safetensors"));
    crew_model_free(m);
    crew_dataset_free(test);
    crew_dataset_free(train);
    return 0;
}
