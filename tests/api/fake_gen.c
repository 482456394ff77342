#define _GNU_SOURCE
#include "fake_gen.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"

/* Waits on f->cond for at most 10 ms; f->mu held. */
static void wait_a_little(struct fake_gen *f)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 10 * 1000000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&f->cond, &f->mu, &ts);
}

bool fake_gen_emit(struct fake_gen_req *q, const struct gen_event *ev)
{
    struct fake_gen *f = q->f;
    pthread_mutex_lock(&f->mu);
    if (q->cancelled) {
        pthread_mutex_unlock(&f->mu);
        return false;
    }
    q->in_cb = true;
    q->cb_th = pthread_self();
    pthread_mutex_unlock(&f->mu);
    q->fn(q->ctx, ev);
    pthread_mutex_lock(&f->mu);
    q->in_cb = false;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->mu);
    return true;
}

void fake_gen_wait_cancel(struct fake_gen_req *q, int ms)
{
    struct fake_gen *f = q->f;
    int64_t until = clock_ns() + (int64_t)ms * 1000000;
    pthread_mutex_lock(&f->mu);
    while (!q->cancelled && clock_ns() < until)
        wait_a_little(f);
    pthread_mutex_unlock(&f->mu);
}

/* An event, then a 1 ms pause; false once cancelled. */
static bool step(struct fake_gen_req *q, const struct gen_event *ev)
{
    if (!fake_gen_emit(q, ev))
        return false;
    usleep(1000);
    return true;
}

void fake_gen_play_basic(struct fake_gen_req *q)
{
    struct gen_event start = {.kind = GEN_EVENT_START, .usage = {.prompt_tokens = 7, .cached_tokens = 2}};
    struct gen_event end = {.kind = GEN_EVENT_END, .usage = {.prompt_tokens = 7, .cached_tokens = 2}};
    struct gen_event d = {.kind = GEN_EVENT_DELTA, .content = "", .reasoning = ""};
    struct gen_event done = {.kind = GEN_EVENT_SEQ_DONE, .finish = "stop"};
    struct gen_event err = {.kind = GEN_EVENT_ERROR};
    json_t *calls = NULL;
    switch (q->script) {
    case S_TEXT:
    case S_THINK:
    case S_LENGTH: {
        const char *const text[] = {"Hel", "lo", " world"};
        bool ok = step(q, &start);
        if (q->script == S_THINK) {
            d.reasoning = "Let me ";
            ok = ok && step(q, &d);
            d.reasoning = "think.";
            ok = ok && step(q, &d);
            d.reasoning = "";
            d.content = "Answer";
            ok = ok && step(q, &d);
        } else if (q->script == S_LENGTH) {
            d.content = "abc";
            ok = ok && step(q, &d);
            done.finish = "length";
        } else {
            for (int i = 0; i < 3 && ok; i++) {
                d.content = text[i];
                ok = step(q, &d);
            }
        }
        done.usage.completion_tokens = end.usage.completion_tokens = 3;
        ok = ok && step(q, &done) && step(q, &end);
        break;
    }
    case S_TOOL:
        calls = json_loads("[{\"id\":\"call_abc\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                           "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":2}\"}}]",
                           0, NULL);
        done.finish = "tool_calls";
        done.tool_calls = calls;
        done.usage.completion_tokens = end.usage.completion_tokens = 12;
        (void)(step(q, &start) && step(q, &d) && step(q, &done) && step(q, &end));
        break;
    case S_ERR_BEFORE:
        err.status = 503;
        err.message = "no instance ready";
        step(q, &err);
        break;
    case S_ERR_AFTER:
        d.content = "partial";
        err.status = 500;
        err.message = "runner failed";
        (void)(step(q, &start) && step(q, &d) && step(q, &err));
        break;
    case S_SEQ_ERROR:
        d.content = "x";
        done.finish = "error";
        (void)(step(q, &start) && step(q, &d) && step(q, &done) && step(q, &end));
        break;
    case S_HANG:
        d.content = "x";
        if (step(q, &start) && step(q, &d))
            fake_gen_wait_cancel(q, 20000);
        step(q, &end); /* only when never cancelled (a failed test) */
        break;
    case S_HANG_EARLY:
        fake_gen_wait_cancel(q, 20000);
        step(q, &end);
        break;
    case S_STOPSEQ:
    case S_MODELSTOP:
        d.content = "abc";
        done.stop_sequence = q->script == S_STOPSEQ ? "END" : "<|im_end|>";
        done.usage.completion_tokens = end.usage.completion_tokens = 2;
        (void)(step(q, &start) && step(q, &d) && step(q, &done) && step(q, &end));
        break;
    case S_MIXED: {
        calls = json_loads("[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                           "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},{\"id\":\"\",\"type\":\"function\","
                           "\"function\":{\"name\":\"get_time\",\"arguments\":\"{}\"}}]",
                           0, NULL);
        d.reasoning = "Plan.";
        bool ok = step(q, &start) && step(q, &d);
        d.reasoning = "";
        d.content = "Calling.";
        done.finish = "tool_calls";
        done.tool_calls = calls;
        done.usage.completion_tokens = end.usage.completion_tokens = 20;
        (void)(ok && step(q, &d) && step(q, &done) && step(q, &end));
        break;
    }
    case S_EMPTY:
        (void)(step(q, &start) && step(q, &done) && step(q, &end));
        break;
    }
    json_decref(calls);
}

static void *fake_main(void *arg)
{
    struct fake_gen_req *q = arg;
    q->f->play(q);
    pthread_mutex_lock(&q->f->mu);
    q->ended = true;
    pthread_cond_broadcast(&q->f->cond);
    pthread_mutex_unlock(&q->f->mu);
    return NULL;
}

static int fake_submit(void *self, struct textgen_params *p, gen_event_fn fn, void *ctx,
                       uint64_t *handle, char *err, size_t errlen)
{
    struct fake_gen *f = self;
    pthread_mutex_lock(&f->mu);
    int delay = f->submit_delay_ms;
    f->in_submit = delay > 0;
    pthread_mutex_unlock(&f->mu);
    if (delay)
        usleep((useconds_t)delay * 1000);
    pthread_mutex_lock(&f->mu);
    f->in_submit = false;
    f->submits++;
    textgen_params_clear(&f->last);
    f->last = *p;
    memset(p, 0, sizeof *p);
    if (f->refuse_status) {
        int st = f->refuse_status;
        if (f->refuse_msg)
            snprintf(err, errlen, "%s", f->refuse_msg);
        else
            snprintf(err, errlen, "refused with %d", st);
        pthread_mutex_unlock(&f->mu);
        return st;
    }
    struct fake_gen_req *q = calloc(1, sizeof *q);
    if (!q) {
        pthread_mutex_unlock(&f->mu);
        snprintf(err, errlen, "out of memory");
        return 500;
    }
    q->f = f;
    q->fn = fn;
    q->ctx = ctx;
    q->handle = ++f->next_handle;
    q->script = f->script;
    q->n = f->last.n > 0 ? f->last.n : 1;
    q->logprobs = f->last.logprobs;
    q->next = f->reqs;
    f->reqs = q;
    *handle = q->handle;
    bool sync = f->sync;
    if (!sync) {
        q->have_thread = pthread_create(&q->th, NULL, fake_main, q) == 0;
        q->ended = !q->have_thread;
    }
    pthread_mutex_unlock(&f->mu);
    if (sync)
        fake_main(q);
    else if (!q->have_thread)
        snprintf(err, errlen, "no thread for the script");
    return sync || q->have_thread ? 0 : 500;
}

static void fake_cancel(void *self, uint64_t handle)
{
    struct fake_gen *f = self;
    pthread_mutex_lock(&f->mu);
    struct fake_gen_req *q = f->reqs;
    while (q && q->handle != handle)
        q = q->next;
    f->cancels++;
    if (!q || q->ended)
        f->cancels_after_end++; /* allowed: a no-op */
    if (q) {
        if (q->cancelled)
            f->double_cancels++;
        q->cancels++;
        q->cancelled = true;
        pthread_cond_broadcast(&f->cond);
        if (q->in_cb && pthread_equal(q->cb_th, pthread_self()))
            f->cancels_in_callback++; /* waiting would deadlock, as a real backend does */
        else
            while (q->in_cb) /* a callback in flight finishes first */
                pthread_cond_wait(&f->cond, &f->mu);
    }
    pthread_mutex_unlock(&f->mu);
}

static json_t *fake_models(void *self)
{
    struct fake_gen *f = self;
    pthread_mutex_lock(&f->mu);
    json_t *m = json_deep_copy(f->models);
    pthread_mutex_unlock(&f->mu);
    return m;
}

const struct gen_ops fake_gen_ops = {.submit = fake_submit, .cancel = fake_cancel, .models = fake_models};

void fake_gen_init(struct fake_gen *f)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cond, NULL);
    textgen_params_init(&f->last);
    f->play = fake_gen_play_basic;
    f->models = json_array();
}

/* Joins and frees the requests whose scripts ended (all of them with wait_all). */
static void reap(struct fake_gen *f, bool wait_all)
{
    pthread_mutex_lock(&f->mu);
    struct fake_gen_req **link = &f->reqs;
    struct fake_gen_req *done = NULL;
    while (*link) {
        struct fake_gen_req *q = *link;
        if (q->ended || wait_all) {
            *link = q->next;
            q->next = done;
            done = q;
        } else {
            link = &q->next;
        }
    }
    pthread_mutex_unlock(&f->mu);
    for (struct fake_gen_req *q = done, *next; q; q = next) {
        next = q->next;
        if (q->have_thread)
            pthread_join(q->th, NULL);
        free(q);
    }
}

bool fake_gen_join(struct fake_gen *f)
{
    int64_t until = clock_ns() + (int64_t)10 * 1000000000;
    bool all = false;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        all = true;
        for (struct fake_gen_req *q = f->reqs; q; q = q->next)
            all = all && q->ended;
        if (all || clock_ns() >= until)
            break;
        wait_a_little(f);
    }
    pthread_mutex_unlock(&f->mu);
    reap(f, false);
    return all;
}

void fake_gen_reset(struct fake_gen *f, int script)
{
    fake_gen_join(f);
    pthread_mutex_lock(&f->mu);
    f->script = script;
    f->sync = false;
    f->delta_sleep_us = 0;
    f->refuse_status = 0;
    f->refuse_msg = NULL;
    f->submit_delay_ms = 0;
    f->submits = f->cancels = f->cancels_after_end = f->double_cancels = 0;
    f->cancels_in_callback = 0;
    textgen_params_clear(&f->last);
    pthread_mutex_unlock(&f->mu);
}

void fake_gen_release(struct fake_gen *f)
{
    fake_gen_join(f);
    reap(f, true);
    textgen_params_clear(&f->last);
    json_decref(f->models);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cond);
}

int fake_gen_count(struct fake_gen *f, const int *field)
{
    pthread_mutex_lock(&f->mu);
    int v = *field;
    pthread_mutex_unlock(&f->mu);
    return v;
}

bool fake_gen_wait_count(struct fake_gen *f, const int *field, int want, int ms)
{
    int64_t until = clock_ns() + (int64_t)ms * 1000000;
    while (fake_gen_count(f, field) < want && clock_ns() < until)
        usleep(1000);
    return fake_gen_count(f, field) >= want;
}

struct fake_gen_req *fake_gen_newest(struct fake_gen *f)
{
    pthread_mutex_lock(&f->mu);
    struct fake_gen_req *q = f->reqs;
    pthread_mutex_unlock(&f->mu);
    return q;
}

int fake_gen_req_cancels(struct fake_gen *f, struct fake_gen_req *q)
{
    pthread_mutex_lock(&f->mu);
    int n = q ? q->cancels : -1;
    pthread_mutex_unlock(&f->mu);
    return n;
}

bool fake_gen_wait_cancels(struct fake_gen *f, struct fake_gen_req *q, int count, int ms)
{
    int64_t until = clock_ns() + (int64_t)ms * 1000000;
    while (fake_gen_req_cancels(f, q) < count && clock_ns() < until)
        usleep(2000);
    return fake_gen_req_cancels(f, q) >= count;
}
