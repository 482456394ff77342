#include "ref_forward.h"

#include "base/dtype.h"
#include "gguf/gguf.h"
#include "kern/kern.h"
#include "model/model.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whole tensor as doubles, or NULL when absent. */
static double *tensor(const struct gguf_file *f, const char *name, int64_t *rows, int64_t *cols)
{
    const struct gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t)
        return NULL;
    int64_t c = t->ne[0], r = gguf_tensor_nelems(t) / c;
    float *row = malloc((size_t)c * sizeof *row);
    double *out = malloc((size_t)(r * c) * sizeof *out);
    int64_t rb = dtype_row_bytes(t->type, c);
    for (int64_t i = 0; i < r; i++) {
        kern_dequantize_row(t->type, (const char *)t->data + i * rb, row, c);
        for (int64_t j = 0; j < c; j++)
            out[i * c + j] = row[j];
    }
    free(row);
    if (rows)
        *rows = r;
    if (cols)
        *cols = c;
    return out;
}

static double *tensorf(const struct gguf_file *f, const char *fmt, int layer)
{
    char name[128];
    snprintf(name, sizeof name, fmt, layer);
    return tensor(f, name, NULL, NULL);
}

static bool tensorf_exists(const struct gguf_file *f, const char *fmt, int layer)
{
    char name[128];
    snprintf(name, sizeof name, fmt, layer);
    return gguf_find_tensor(f, name) != NULL;
}

/* y[r] = sum_c W[r][c] x[c] for W of rows x cols. */
static void matvec(const double *W, const double *x, double *y, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t c = 0; c < cols; c++)
            s += W[r * cols + c] * x[c];
        y[r] = s;
    }
}

static void rmsnorm(const double *x, const double *w, double *y, int64_t n, double eps)
{
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double scale = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * scale * w[i];
}

/* YaRN as the YaRN paper and llama.cpp's ggml_rope_yarn define it: each dimension pair's
 * angle mixes extrapolation (1) and interpolation (1/factor) by a ramp over the pairs
 * whose wavelength turns beta_fast .. beta_slow times in the original context. */
static double yarn_theta(const struct model_hparams *hp, int i, double th_extrap)
{
    double s = hp->rope_yarn_factor, n = hp->n_rot;
    double corr_fast = n * log((double)hp->rope_yarn_orig_ctx / (hp->rope_yarn_beta_fast * 6.283185307179586)) / (2 * log(hp->rope_base));
    double corr_slow = n * log((double)hp->rope_yarn_orig_ctx / (hp->rope_yarn_beta_slow * 6.283185307179586)) / (2 * log(hp->rope_base));
    double low = floor(corr_fast) < 0 ? 0 : floor(corr_fast), high = ceil(corr_slow) > n - 1 ? n - 1 : ceil(corr_slow);
    double y = (i - low) / (high - low > 0.001 ? high - low : 0.001);
    double ramp = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y);
    return ramp * th_extrap + (1.0 - ramp) * (th_extrap / s);
}

/* local: a gemma3 sliding-window layer's RoPE (its own base, no scaling) */
static void rope(const struct model_hparams *hp, const double *factors, double *v, int64_t pos, bool local)
{
    int half = hp->n_rot / 2;
    double ms = hp->rope_yarn_factor > 1 && !local ? hp->rope_yarn_attn_factor * (1 + 0.1 * log(hp->rope_yarn_factor)) : 1.0;
    for (int i = 0; i < half; i++) {
        double freq = pow(local ? hp->rope_base_swa : hp->rope_base, -2.0 * i / hp->n_rot);
        if (factors && !local)
            freq /= factors[i];
        double th = (double)pos / (local ? 1.0 : hp->rope_linear_scale) * freq;
        if (hp->rope_yarn_factor > 1 && !local)
            th = yarn_theta(hp, i, th);
        int i0 = hp->rope == ROPE_NEOX ? i : 2 * i, i1 = hp->rope == ROPE_NEOX ? i + half : 2 * i + 1;
        double a = v[i0], b = v[i1];
        v[i0] = (a * cos(th) - b * sin(th)) * ms;
        v[i1] = (a * sin(th) + b * cos(th)) * ms;
    }
}

/* The mixture of experts as its definition reads (Qwen3-MoE, Mixtral): softmax over the
 * router's logits, the n_expert_used most probable experts (ties to the lower index),
 * their probabilities renormalised to sum 1 when the model says so, and the weighted sum
 * of their SwiGLU outputs. */
/* gpt-oss's mixture (its model definition): the router's logits plus bias, the k largest, a
 * softmax over those k; each expert's gate and up with biases, gate clamped above at 7, up to
 * [-7, 7], h = gate * sigmoid(1.702 gate) * (up + 1), down with its bias. */
struct oss_moe {
    const double *router_b, *bg, *bu, *bd;
};

static void moe_ffn_oss(const struct model_hparams *hp, const struct oss_moe *ob, const double *router,
                        const double *eg, const double *eu, const double *ed, const double *xn, double *out, double *g,
                        double *u, double *tmp)
{
    int64_t E = hp->n_embd, F = hp->n_ff_exp;
    int NE = hp->n_expert, K = hp->n_expert_used;
    double l[1024], w[1024], sum = 0;
    int sel[1024];
    bool taken[1024] = {false};
    matvec(router, xn, l, NE, E);
    for (int e = 0; e < NE; e++)
        l[e] += ob->router_b[e];
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < NE; e++)
            if (!taken[e] && (best < 0 || l[e] > l[best]))
                best = e;
        taken[best] = true;
        sel[k] = best;
    }
    for (int k = 0; k < K; k++)
        sum += w[k] = exp(l[sel[k]] - l[sel[0]]);
    for (int64_t i = 0; i < E; i++)
        out[i] = 0;
    for (int k = 0; k < K; k++) {
        int64_t e = sel[k];
        matvec(eg + e * F * E, xn, g, F, E);
        matvec(eu + e * F * E, xn, u, F, E);
        for (int64_t i = 0; i < F; i++) {
            double x = fmin(g[i] + ob->bg[e * F + i], 7.0), y = fmax(-7.0, fmin(u[i] + ob->bu[e * F + i], 7.0));
            g[i] = x / (1.0 + exp(-1.702 * x)) * (y + 1.0);
        }
        matvec(ed + e * E * F, g, tmp, E, F);
        for (int64_t i = 0; i < E; i++)
            out[i] += w[k] / sum * (tmp[i] + ob->bd[e * E + i]);
    }
}

static void moe_ffn(const struct model_hparams *hp, const double *router, const double *eg, const double *eu,
                    const double *ed, const double *xn, double *out, double *g, double *u, double *tmp)
{
    int64_t E = hp->n_embd, F = hp->n_ff_exp;
    int NE = hp->n_expert, K = hp->n_expert_used;
    double p[1024], mx = -INFINITY, sum = 0;
    matvec(router, xn, p, NE, E);
    for (int e = 0; e < NE; e++)
        mx = fmax(mx, p[e]);
    for (int e = 0; e < NE; e++)
        sum += p[e] = exp(p[e] - mx);
    bool taken[1024] = {false};
    int sel[1024];
    double w[1024], wsum = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < NE; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best]))
                best = e;
        taken[best] = true;
        sel[k] = best;
        w[k] = p[best] / sum;
        wsum += w[k];
    }
    for (int64_t i = 0; i < E; i++)
        out[i] = 0;
    for (int k = 0; k < K; k++) {
        int64_t e = sel[k];
        matvec(eg + e * F * E, xn, g, F, E);
        matvec(eu + e * F * E, xn, u, F, E);
        for (int64_t i = 0; i < F; i++)
            g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        matvec(ed + e * E * F, g, tmp, E, F);
        double wk = hp->expert_norm ? w[k] / wsum : w[k];
        for (int64_t i = 0; i < E; i++)
            out[i] += wk * tmp[i];
    }
}

double *ref_forward(const char *path, const int32_t *tokens, int n, int *n_vocab_out)
{
    char err[512];
    struct gguf_file *f;
    if (gguf_open(&f, path, err, sizeof err)) {
        fprintf(stderr, "ref_forward: %s\n", err);
        return NULL;
    }
    struct model_hparams hp;
    if (model_read_hparams(f, &hp, err, sizeof err)) {
        fprintf(stderr, "ref_forward: %s\n", err);
        gguf_close(f);
        return NULL;
    }
    int64_t E = hp.n_embd, hd = hp.head_dim, qd = (int64_t)hp.n_head * hd, kvd = (int64_t)hp.n_head_kv * hd;
    int64_t V = hp.n_vocab, F = hp.n_ff > hp.n_ff_exp ? hp.n_ff : hp.n_ff_exp;
    double *emb = tensor(f, "token_embd.weight", NULL, NULL);
    double *head = hp.tied_output ? emb : tensor(f, "output.weight", NULL, NULL);
    double *onorm = tensor(f, "output_norm.weight", NULL, NULL);
    double *factors = tensor(f, "rope_freqs.weight", NULL, NULL);
    double *x = calloc((size_t)(n * E), sizeof *x);
    double *K = calloc((size_t)(n * kvd), sizeof *K), *Vc = calloc((size_t)(n * kvd), sizeof *Vc);
    double *xn = malloc((size_t)E * sizeof *xn), *q = malloc((size_t)qd * sizeof *q);
    double *att = malloc((size_t)(qd > E ? qd : E) * sizeof *att), *tmp = malloc((size_t)E * sizeof *tmp);
    double *g = malloc((size_t)F * sizeof *g), *u = malloc((size_t)F * sizeof *u);
    double *sc = malloc((size_t)n * sizeof *sc);
    for (int t = 0; t < n; t++)
        for (int64_t i = 0; i < E; i++)
            x[t * E + i] = emb[(int64_t)tokens[t] * E + i] * (hp.gemma ? sqrt((double)E) : 1.0);
    /* gemma3 (gpt-oss): every swa_pattern-th (every other) layer global, the others see the
     * last swa_window positions; gemma3's rotate with their own RoPE, gpt-oss's as the others */
    for (int l = 0; l < hp.n_layers; l++) {
        bool window = hp.swa_window > 0 && l % hp.swa_pattern != hp.swa_pattern - 1;
        bool local = window && hp.gemma;
        double *qkv = tensorf(f, "blk.%d.attn_qkv.weight", l); /* phi3: q, k, v rows */
        double *an = tensorf(f, "blk.%d.attn_norm.weight", l), *wq = tensorf(f, "blk.%d.attn_q.weight", l);
        double *wk = tensorf(f, "blk.%d.attn_k.weight", l), *wv = tensorf(f, "blk.%d.attn_v.weight", l);
        double *wo = tensorf(f, "blk.%d.attn_output.weight", l), *fn = tensorf(f, "blk.%d.ffn_norm.weight", l);
        double *bo = tensorf(f, "blk.%d.attn_output.bias", l), *sinks = tensorf(f, "blk.%d.attn_sinks.weight", l);
        struct oss_moe ob = {tensorf(f, "blk.%d.ffn_gate_inp.bias", l), tensorf(f, "blk.%d.ffn_gate_exps.bias", l),
                             tensorf(f, "blk.%d.ffn_up_exps.bias", l), tensorf(f, "blk.%d.ffn_down_exps.bias", l)};
        double *wg = tensorf(f, "blk.%d.ffn_gate.weight", l), *wu = tensorf(f, "blk.%d.ffn_up.weight", l);
        double *wd = tensorf(f, "blk.%d.ffn_down.weight", l);
        double *router = tensorf(f, "blk.%d.ffn_gate_inp.weight", l);
        double *eg = tensorf(f, "blk.%d.ffn_gate_exps.weight", l), *eu = tensorf(f, "blk.%d.ffn_up_exps.weight", l);
        double *ed = tensorf(f, "blk.%d.ffn_down_exps.weight", l);
        double *bq = tensorf(f, "blk.%d.attn_q.bias", l), *bk = tensorf(f, "blk.%d.attn_k.bias", l);
        double *bv = tensorf(f, "blk.%d.attn_v.bias", l);
        double *qn = tensorf(f, "blk.%d.attn_q_norm.weight", l), *kn = tensorf(f, "blk.%d.attn_k_norm.weight", l);
        double *pan = tensorf(f, "blk.%d.post_attention_norm.weight", l);
        double *pfn = tensorf(f, "blk.%d.post_ffw_norm.weight", l);
        if (hp.oss) { /* its norm before the FFN is named post_attention_norm */
            fn = pan;
            pan = NULL;
        }
        if (qkv) {
            wq = qkv;
            wk = qkv + qd * E;
            wv = qkv + (qd + kvd) * E;
        }
        if (!wg) { /* phi3: ffn_up holds the gate's rows, then the up's */
            wg = wu;
            wu = wu + F * E;
        }
        /* K and V of every position first (causal attention only reads earlier ones). */
        for (int t = 0; t < n; t++) {
            rmsnorm(x + t * E, an, xn, E, hp.norm_eps);
            double *k = K + t * kvd, *v = Vc + t * kvd;
            matvec(wk, xn, k, kvd, E);
            matvec(wv, xn, v, kvd, E);
            for (int64_t i = 0; bk && i < kvd; i++)
                k[i] += bk[i];
            for (int64_t i = 0; bv && i < kvd; i++)
                v[i] += bv[i];
            for (int h = 0; h < hp.n_head_kv; h++) {
                if (kn)
                    rmsnorm(k + h * hd, kn, k + h * hd, hd, hp.norm_eps);
                rope(&hp, factors, k + h * hd, t, local);
            }
        }
        for (int t = 0; t < n; t++) {
            rmsnorm(x + t * E, an, xn, E, hp.norm_eps);
            matvec(wq, xn, q, qd, E);
            for (int64_t i = 0; bq && i < qd; i++)
                q[i] += bq[i];
            for (int h = 0; h < hp.n_head; h++) {
                double *qh = q + h * hd;
                if (qn)
                    rmsnorm(qh, qn, qh, hd, hp.norm_eps);
                rope(&hp, factors, qh, t, local);
                int kh = h / (hp.n_head / hp.n_head_kv);
                double max = -INFINITY, sum = 0;
                int p0 = window && t >= hp.swa_window ? t - (int)hp.swa_window + 1 : 0;
                /* gemma3 27B scales by n_embd / n_head, every other model by head_dim */
                double scale = hp.gemma && hp.n_layers == 62 ? 1.0 / sqrt((double)(E / hp.n_head)) : 1.0 / sqrt((double)hd);
                for (int p = p0; p <= t; p++) {
                    double s = 0;
                    for (int64_t i = 0; i < hd; i++)
                        s += qh[i] * K[p * kvd + kh * hd + i];
                    sc[p] = s * scale;
                    max = fmax(max, sc[p]);
                }
                if (sinks) /* gpt-oss: a logit per head that takes part in the softmax, with no value */
                    max = fmax(max, sinks[h]);
                for (int p = p0; p <= t; p++)
                    sum += sc[p] = exp(sc[p] - max);
                if (sinks)
                    sum += exp(sinks[h] - max);
                for (int64_t i = 0; i < hd; i++) {
                    double o = 0;
                    for (int p = p0; p <= t; p++)
                        o += sc[p] / sum * Vc[p * kvd + kh * hd + i];
                    att[h * hd + i] = o;
                }
            }
            matvec(wo, att, tmp, E, qd);
            for (int64_t i = 0; bo && i < E; i++)
                tmp[i] += bo[i];
            if (pan)
                rmsnorm(tmp, pan, tmp, E, hp.norm_eps);
            for (int64_t i = 0; i < E; i++)
                x[t * E + i] += tmp[i];
        }
        for (int t = 0; t < n; t++) {
            rmsnorm(x + t * E, fn, xn, E, hp.norm_eps);
            if (router) {
                if (hp.oss)
                    moe_ffn_oss(&hp, &ob, router, eg, eu, ed, xn, att, g, u, tmp);
                else
                    moe_ffn(&hp, router, eg, eu, ed, xn, att, g, u, tmp);
                for (int64_t i = 0; i < E; i++)
                    x[t * E + i] += att[i];
                continue;
            }
            matvec(wg, xn, g, F, E);
            matvec(wu, xn, u, F, E);
            for (int64_t i = 0; i < F; i++)
                g[i] = hp.gemma ? 0.5 * g[i] * (1.0 + tanh(sqrt(2.0 / M_PI) * (g[i] + 0.044715 * g[i] * g[i] * g[i]))) * u[i]
                                : g[i] / (1.0 + exp(-g[i])) * u[i];
            matvec(wd, g, tmp, E, F);
            if (pfn)
                rmsnorm(tmp, pfn, tmp, E, hp.norm_eps);
            for (int64_t i = 0; i < E; i++)
                x[t * E + i] += tmp[i];
        }
        if (qkv)
            wq = wk = wv = NULL;
        if (!tensorf_exists(f, "blk.%d.ffn_gate.weight", l))
            wu = NULL; /* part of wg's allocation */
        double *all[] = {an, wq, wk, wv, wo, fn, wg, wu, wd, bq, bk, bv, qn, kn, pan, pfn, qkv, router, eg, eu, ed, bo, sinks,
                         (double *)ob.router_b, (double *)ob.bg, (double *)ob.bu, (double *)ob.bd};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            free(all[i]);
    }
    double *logits = malloc((size_t)(n * V) * sizeof *logits);
    for (int t = 0; t < n; t++) {
        rmsnorm(x + t * E, onorm, xn, E, hp.norm_eps);
        matvec(head, xn, logits + t * V, V, E);
        for (int64_t i = 0; hp.logit_softcap > 0 && i < V; i++)
            logits[t * V + i] = tanh(logits[t * V + i] / hp.logit_softcap) * hp.logit_softcap;
    }
    *n_vocab_out = (int)V;
    if (head != emb)
        free(head);
    free(emb), free(onorm), free(factors), free(x), free(K), free(Vc), free(xn), free(q), free(att);
    free(tmp), free(g), free(u), free(sc);
    gguf_close(f);
    return logits;
}
