/* What a decode step's attention kernels cost per key with their data in L1, on llama-1b's
 * shape (one KV head's 4 query rows, head dim 64, blocks of 16 keys, 64 keys a call as
 * decode_tile's steps): ns per key (of the 4 rows) of attn_qk_paged, softmax_tile and
 * attn_pv for each KV type, per CPU-second of this thread, and the K+V bytes per second
 * their sum allows. Against the read rate of one core this says whether a decode at depth
 * is bound by its arithmetic or by memory (bench_attn_long prints both rates).
 *   usage: bench_attn_kernels [VARIANT best] [REPS 100000] */
#include "base/dtype.h"
#include "engine/vec.h"
#include "kern/kern.h"
#include "kern/quant.h"
#include "bench_util.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { HD = 64, KEYS = 64, ROWS = 4, BT = 16, LDS = 256 };

/* K blocks (transposed, each type's layout of vec.h) and V rows of KEYS keys of one head. */
struct keys {
    uint16_t kf[KEYS / BT][HD * BT];                 /* F16: K(d, j) at [d*BT + j] */
    _Alignas(64) int8_t k8[KEYS / BT][HD * BT + 2 * (HD / 32) * BT]; /* Q8_0: codes, then the half scales */
    _Alignas(64) uint8_t k4[KEYS / BT][HD / 2 * BT + 2 * (HD / 32) * BT]; /* Q4_0: nibble pairs, then the scales */
    uint16_t vf[KEYS][HD];
    struct block_q8_0 v8[KEYS][HD / 32];
    struct block_q4_0 v4[KEYS][HD / 32];
};

static void fill(struct keys *k, uint64_t *seed)
{
    for (int b = 0; b < KEYS / BT; b++) {
        for (int i = 0; i < HD * BT; i++) {
            k->kf[b][i] = kern_f32_to_f16(bench_rnd_lcg(seed));
            k->k8[b][i] = (int8_t)(bench_rnd_lcg(seed) * 127.0f);
        }
        for (int i = 0; i < HD / 2 * BT; i++)
            k->k4[b][i] = (uint8_t)(bench_rnd_lcg(seed) * 255.0f);
        const uint16_t scale = kern_f32_to_f16(0.01f);
        for (int i = 0; i < (HD / 32) * BT; i++) { /* bytes, as the KV cache holds them */
            memcpy(k->k8[b] + HD * BT + 2 * i, &scale, sizeof scale);
            memcpy(k->k4[b] + HD / 2 * BT + 2 * i, &scale, sizeof scale);
        }
    }
    for (int j = 0; j < KEYS; j++) {
        for (int i = 0; i < HD; i++)
            k->vf[j][i] = kern_f32_to_f16(bench_rnd_lcg(seed));
        for (int c = 0; c < HD / 32; c++) {
            k->v8[j][c].d = k->v4[j][c].d = kern_f32_to_f16(0.01f);
            for (int i = 0; i < 32; i++)
                k->v8[j][c].qs[i] = (int8_t)(bench_rnd_lcg(seed) * 127.0f);
            for (int i = 0; i < 16; i++)
                k->v4[j][c].qs[i] = (uint8_t)(bench_rnd_lcg(seed) * 255.0f);
        }
    }
}

int main(int argc, char **argv)
{
    const struct vec_ops *vec = argc > 1 && strcmp(argv[1], "best") ? vec_ops_variant(argv[1]) : vec_ops_best();
    int reps = argc > 2 ? atoi(argv[2]) : 100000;
    if (!vec || reps < 1) {
        fprintf(stderr, "usage: bench_attn_kernels [ref|avx2|avx512|avx512-novnni|neon] [REPS]\n");
        return 2;
    }
    static struct keys k;
    uint64_t seed = 42;
    fill(&k, &seed);
    float q[ROWS * HD], s[ROWS * LDS], o[ROWS * HD], l;
    _Alignas(64) char q8[ROWS * VEC_Q8_ROW_BYTES(HD)]; /* vec.h: query rows 4-byte aligned */
    for (int i = 0; i < ROWS * HD; i++)
        q[i] = bench_rnd_lcg(&seed);
    for (int r = 0; r < ROWS; r++)
        vec->q8_query(q + r * HD, HD, q8 + r * VEC_Q8_ROW_BYTES(HD));
    for (int i = 0; i < ROWS * LDS; i++)
        s[i] = bench_rnd_lcg(&seed);
    memset(o, 0, sizeof o);
    const void *kf[KEYS / BT], *k8[KEYS / BT], *k4[KEYS / BT], *vf[KEYS], *v8[KEYS], *v4[KEYS];
    const uint16_t *ks8[KEYS / BT], *ks4[KEYS / BT];
    for (int b = 0; b < KEYS / BT; b++) {
        kf[b] = k.kf[b];
        k8[b] = k.k8[b];
        k4[b] = k.k4[b];
        ks8[b] = (const uint16_t *)(k.k8[b] + HD * BT);
        ks4[b] = (const uint16_t *)(k.k4[b] + HD / 2 * BT);
    }
    for (int j = 0; j < KEYS; j++) {
        vf[j] = k.vf[j];
        v8[j] = k.v8[j];
        v4[j] = k.v4[j];
    }
    int32_t cnt[ROWS] = {KEYS, KEYS, KEYS, KEYS};
    const int types[] = {DT_F16, DT_Q8_0, DT_Q4_0};
    double sm = 0;
    for (int rep = 0; rep < 2; rep++) { /* the softmax once for both types: it sees only scores */
        double c0 = bench_process_cpu_s();
        for (int i = 0; i < reps; i++)
            for (int r = 0; r < ROWS; r++)
                vec->softmax_tile(s + r * LDS, KEYS, &l);
        double t = (bench_process_cpu_s() - c0) / reps / KEYS * 1e9;
        sm = rep == 0 || t < sm ? t : sm;
    }
    for (int ti = 0; ti < 3; ti++) {
        int type = types[ti];
        bool q8k = type == DT_Q8_0, q4k = type == DT_Q4_0;
        const void *const *kb = q8k ? k8 : q4k ? k4 : kf, *const *vb = q8k ? v8 : q4k ? v4 : vf;
        const uint16_t *const *ks = q8k ? ks8 : q4k ? ks4 : NULL;
        const void *qr = q8k ? (const void *)q8 : (const void *)q;
        int64_t ldq = q8k ? VEC_Q8_ROW_BYTES(HD) : HD;
        double qk = 0, pv = 0;
        for (int rep = 0; rep < 2; rep++) { /* best of two rounds */
            double c0 = bench_process_cpu_s();
            for (int i = 0; i < reps; i++)
                vec->attn_qk_paged(qr, ldq, ROWS, kb, ks, BT, KEYS, HD, type, s, LDS, NULL);
            double c1 = bench_process_cpu_s();
            for (int i = 0; i < reps; i++)
                vec->attn_pv(o, HD, ROWS, s, LDS, cnt, vb, HD, type, NULL);
            double c2 = bench_process_cpu_s();
            double a = (c1 - c0) / reps / KEYS * 1e9, b = (c2 - c1) / reps / KEYS * 1e9;
            qk = rep == 0 || a < qk ? a : qk;
            pv = rep == 0 || b < pv ? b : pv;
        }
        /* K+V bytes of one key of one KV head in the cache */
        double bytes = q8k ? 2.0 * (HD + 2 * (HD / 32)) : q4k ? 2.0 * (HD / 2 + 2 * (HD / 32)) : 2.0 * 2 * HD;
        printf("%s KV: Q.K %.2f ns, softmax %.2f ns, P.V %.2f ns per key of %d rows: %.2f ns, %.1f GB/s of K+V "
               "per CPU-second\n",
               dtype_name(type), qk, sm, pv, ROWS, qk + sm + pv, bytes / (qk + sm + pv));
    }
    printf("(checksum %g)\n", (double)o[5]);
    return 0;
}
