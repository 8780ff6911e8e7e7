// Writes ggml's own quantized bytes, dequantized floats and generic vec_dot results for
// q5_0, q5_1, q4_K, q5_K, q6_K (and the activations q8_0, q8_1, q8_K) of a fixed row, into
// kquants/. tests/kquants_ggml.rs rebuilds the same row and checks our references against it.
//
// ggml source: vendor/llama.cpp/ggml of the PyPI sdist llama-cpp-python==0.3.36. Built and run
// (x86-64, gcc 12) from this directory with G=<sdist>/vendor/llama.cpp/ggml:
//   F="-O2 -ffp-contract=off -DNDEBUG -I$G/include -I$G/src -I$G/src/ggml-cpu"
//   gcc $F -c $G/src/ggml-quants.c -o /tmp/gq.o
//   gcc $F -c $G/src/ggml-cpu/quants.c -o /tmp/cq.o
//   gcc $F gen_kquants.c /tmp/gq.o /tmp/cq.o -lm -o /tmp/gen_kquants && /tmp/gen_kquants kquants
// -ffp-contract=off: no FMA contraction, as Rust (which never contracts). -DNDEBUG: the hostile
// segments (1e30) feed NaN to nearest_int, whose assert would abort a debug build.
// quants.c without -march reads f16 through ggml_table_f32_f16, filled here.
// The generator itself must be built with -ffp-contract=off too: its input row has `a * b + c`.
//
// Built with -march=native instead (FMA contraction, as llama.cpp's x86 builds; checked on
// gcc 12, x86-64 with FMA/F16C/AVX2, generator still contract-off), ggml's bytes differ for
// quantize_row_q4_K_ref and quantize_row_q5_K_ref (2 and 6 of 16 super-blocks here; the float
// sums in make_qkx2_quants contract), and the generic vec_dot results differ in the last bits
// for q5_1 (`d*sumi + m*s`), q4_K, q5_K and q6_K (`sums[l] += d*aux32[l]`). q5_0, q5_1, q6_K,
// q8_K, q8_0 and q8_1 quantize to the same bytes either way, and q5_0's dot is the same.
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-common.h"
#include "ggml-impl.h"
#include "ggml-quants.h"
#include "quants.h"

// What ggml-quants.o / quants.o need from ggml.c, none of it reached by the functions used.
float ggml_table_f32_f16[1 << 16];
void ggml_abort(const char *file, int line, const char *fmt, ...) { (void)fmt; fprintf(stderr, "abort %s:%d\n", file, line); abort(); }
size_t ggml_type_size(enum ggml_type t) { (void)t; abort(); }
size_t ggml_row_size(enum ggml_type t, int64_t ne) { (void)t; (void)ne; abort(); }
const char *ggml_type_name(enum ggml_type t) { (void)t; return "?"; }

#define N 4096
#define NSEG 9
// Segment starts (values); the last ends at N. Must match SEGMENTS in kquants_ggml.rs.
static const int seg[NSEG + 1] = {0, 2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096};

static uint64_t st;
static float lcg(void) {
    st = st * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)(uint32_t)(st >> 40) / 16777216.0f * 2.0f - 1.0f;
}

// The weight row: normal-ish data, then all zeros, a constant, outliers, tiny, huge (f16
// overflow, NaN inside the K-quant searches), mixed magnitudes per sub-block, exact ties on
// k/8, and a negative-dominated block.
static void weights(float *x) {
    st = 1;
    for (int i = 0; i < 2048; i++) { float a = lcg(); float b = lcg(); x[i] = (a + b) * 0.75f; }
    for (int i = 2048; i < 2304; i++) x[i] = 0.0f;
    for (int i = 2304; i < 2560; i++) x[i] = 0.37f;
    for (int i = 2560; i < 2816; i++) x[i] = lcg() * 0.01f;
    x[2560 + 77] = 50.0f;
    x[2560 + 200] = -30.0f;
    for (int i = 2816; i < 3072; i++) x[i] = lcg() * 1e-20f;
    for (int i = 3072; i < 3328; i++) x[i] = lcg() * 1e30f;
    for (int i = 3328; i < 3584; i++) { float a = lcg(); x[i] = ((i / 32) % 2) ? a * 10.0f : a * 1e-3f; }
    for (int i = 3584; i < 3840; i++) x[i] = (float)(int)(lcg() * 16.0f) / 8.0f;
    for (int i = 3840; i < 4096; i++) x[i] = -fabsf(lcg()) * 3.0f + 0.1f;
}

static void activations(float *x) {
    st = 2;
    for (int i = 0; i < N; i++) { float a = lcg(); float b = lcg(); x[i] = (a + b) * 2.0f; }
}

static const char *dir;
static void put(const char *name, const void *p, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { perror(path); exit(1); }
    fclose(f);
}

static float x[N], a[N], deq[N];
static block_q5_0 w50[N / 32];
static block_q5_1 w51[N / 32];
static block_q4_K w4k[N / 256];
static block_q5_K w5k[N / 256];
static block_q6_K w6k[N / 256];
static block_q8_K w8k[N / 256];
static block_q8_0 a80[N / 32];
static block_q8_1 a81[N / 32];
static block_q8_K a8k[N / 256];
static float dots[5][NSEG + 1];

typedef void (*dotfn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);

// dots[t][s] for each segment, dots[t][NSEG] for the whole row.
static void dot_all(int t, dotfn f, const void *w, size_t wsz, const void *act, size_t asz, int qk) {
    for (int s = 0; s <= NSEG; s++) {
        int b = s < NSEG ? seg[s] : 0, e = s < NSEG ? seg[s + 1] : N;
        f(e - b, &dots[t][s], 0, (const char *)w + (size_t)(b / qk) * wsz, 0,
          (const char *)act + (size_t)(b / qk) * asz, 0, 1);
    }
}

int main(int argc, char **argv) {
    dir = argc > 1 ? argv[1] : ".";
    for (int i = 0; i < 1 << 16; i++) ggml_table_f32_f16[i] = GGML_FP16_TO_FP32((ggml_fp16_t)i);
    weights(x);
    activations(a);
    // ggml leaves an all-zero block's bsums untouched; start from zeros so the bytes are defined.
    memset(w8k, 0, sizeof w8k);
    memset(a8k, 0, sizeof a8k);

    quantize_row_q5_0_ref(x, w50, N); put("q5_0.bin", w50, sizeof w50);
    dequantize_row_q5_0(w50, deq, N); put("q5_0.deq.bin", deq, sizeof deq);
    quantize_row_q5_1_ref(x, w51, N); put("q5_1.bin", w51, sizeof w51);
    dequantize_row_q5_1(w51, deq, N); put("q5_1.deq.bin", deq, sizeof deq);
    quantize_row_q4_K_ref(x, w4k, N); put("q4_k.bin", w4k, sizeof w4k);
    dequantize_row_q4_K(w4k, deq, N); put("q4_k.deq.bin", deq, sizeof deq);
    quantize_row_q5_K_ref(x, w5k, N); put("q5_k.bin", w5k, sizeof w5k);
    dequantize_row_q5_K(w5k, deq, N); put("q5_k.deq.bin", deq, sizeof deq);
    quantize_row_q6_K_ref(x, w6k, N); put("q6_k.bin", w6k, sizeof w6k);
    dequantize_row_q6_K(w6k, deq, N); put("q6_k.deq.bin", deq, sizeof deq);
    quantize_row_q8_K_ref(x, w8k, N); put("q8_k.bin", w8k, sizeof w8k);
    dequantize_row_q8_K(w8k, deq, N); put("q8_k.deq.bin", deq, sizeof deq);

    quantize_row_q8_0_ref(a, a80, N); put("act_q8_0.bin", a80, sizeof a80);
    quantize_row_q8_1_ref(a, a81, N); put("act_q8_1.bin", a81, sizeof a81);
    quantize_row_q8_K_ref(a, a8k, N); put("act_q8_k.bin", a8k, sizeof a8k);

    dot_all(0, ggml_vec_dot_q5_0_q8_0_generic, w50, sizeof *w50, a80, sizeof *a80, 32);
    dot_all(1, ggml_vec_dot_q5_1_q8_1_generic, w51, sizeof *w51, a81, sizeof *a81, 32);
    dot_all(2, ggml_vec_dot_q4_K_q8_K_generic, w4k, sizeof *w4k, a8k, sizeof *a8k, 256);
    dot_all(3, ggml_vec_dot_q5_K_q8_K_generic, w5k, sizeof *w5k, a8k, sizeof *a8k, 256);
    dot_all(4, ggml_vec_dot_q6_K_q8_K_generic, w6k, sizeof *w6k, a8k, sizeof *a8k, 256);
    put("dots.bin", dots, sizeof dots);
    return 0;
}
