/* A fake generation backend (gen.h) for the front-end tests: it records the
 * textgen_params of each submit and plays a script of events for each request on a
 * thread of its own (or inside submit), with every wait bounded. Its cancel keeps the
 * strict contract a real backend has: it waits for a callback of that request in
 * flight on another thread, and once it returns no callback of the request runs.
 * Cancels are counted per request and in all, with those that came after the script
 * ended, twice, or from inside a callback of the same request (a front-end bug: a real
 * backend would deadlock) counted apart.
 *
 * Fields marked (mu) are read and written under mu while requests run; fake_gen_count
 * reads one. The test sets the others between requests. */
#ifndef CAIRN_TESTS_API_FAKE_GEN_H
#define CAIRN_TESTS_API_FAKE_GEN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "api/gen.h"

/* The scripts of fake_gen_play_basic (one sequence; START and END report 7 prompt
 * tokens, 2 of them cached; each event is followed by a 1 ms pause). */
enum fake_gen_script {
    S_TEXT,       /* "Hel" "lo" " world", stop (3 tokens) */
    S_THINK,      /* reasoning "Let me " "think.", then "Answer" */
    S_TOOL,       /* one tool call get_weather {"city": "Paris", "days": 2} (12 tokens) */
    S_LENGTH,     /* "abc", length */
    S_ERR_BEFORE, /* ERROR 503 "no instance ready" before START */
    S_ERR_AFTER,  /* START, "partial", ERROR 500 "runner failed" */
    S_SEQ_ERROR,  /* START, "x", SEQ_DONE finish "error", END */
    S_HANG,       /* START, "x", then nothing until cancelled (20 s at most) */
    S_HANG_EARLY, /* nothing until cancelled */
    S_STOPSEQ,    /* "abc", stop on "END" (2 tokens) */
    S_MODELSTOP,  /* "abc", stop on the model's own "<|im_end|>" */
    S_MIXED,      /* reasoning "Plan.", text "Calling.", two tool calls (20 tokens) */
    S_EMPTY,      /* START, SEQ_DONE, END: no text at all */
};

struct fake_gen;

/* One submitted request. */
struct fake_gen_req {
    struct fake_gen *f;
    gen_event_fn fn;
    void *ctx;
    uint64_t handle;
    int script;    /* the fake's script when submitted */
    int n;         /* sequences asked for (textgen_params.n, at least 1) */
    bool logprobs; /* logprobs asked for */
    pthread_t th, cb_th; /* the script's thread; the thread of the callback in flight */
    bool have_thread;
    bool cancelled, in_cb, ended; /* (mu) */
    int cancels;                  /* (mu) */
    struct fake_gen_req *next;
};

struct fake_gen {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    /* Plays the script of q (fake_gen_emit, fake_gen_wait_cancel); returns when done. */
    void (*play)(struct fake_gen_req *q);
    int script;          /* of the next submit */
    bool sync;           /* play inside submit, on the caller's thread */
    int delta_sleep_us;  /* for play functions that pause between deltas */
    int refuse_status;   /* submit refuses with this status when not 0 */
    const char *refuse_msg; /* and this message (NULL: "refused with <status>") */
    int submit_delay_ms; /* submit sleeps this long first, with in_submit set */
    bool in_submit;      /* (mu) */
    struct textgen_params last; /* (mu) what the last submit got */
    int submits;         /* (mu) */
    int cancels;         /* (mu) every cancel call */
    int cancels_after_end, double_cancels, cancels_in_callback; /* (mu) among them */
    uint64_t next_handle;
    struct fake_gen_req *reqs; /* newest first */
    json_t *models;            /* what models returns (a copy of); owned */
};

/* The ops over a struct fake_gen as self. */
extern const struct gen_ops fake_gen_ops;

/* Sets up f: nothing submitted, play fake_gen_play_basic, models an empty array. */
void fake_gen_init(struct fake_gen *f);

/* Waits for every script (bounded), joins and frees f's requests, and frees f. */
void fake_gen_release(struct fake_gen *f);

/* Waits up to 10 s for every script to end, then joins and frees the requests (any
 * fake_gen_req pointer taken before is gone). True when all had ended. */
bool fake_gen_join(struct fake_gen *f);

/* fake_gen_join, then sets the script of the next submits, zeroes the counters, the
 * refusal, sync, delays and pauses, and clears last; play stays. */
void fake_gen_reset(struct fake_gen *f, int script);

/* *field (a member of f marked (mu)) read under f->mu. */
int fake_gen_count(struct fake_gen *f, const int *field);

/* Waits up to ms for *field to reach want. */
bool fake_gen_wait_count(struct fake_gen *f, const int *field, int want, int ms);

/* The request submitted last, or NULL. */
struct fake_gen_req *fake_gen_newest(struct fake_gen *f);

/* Cancels of request q so far (-1 for NULL). */
int fake_gen_req_cancels(struct fake_gen *f, struct fake_gen_req *q);

/* Waits up to ms for request q to be cancelled count times. */
bool fake_gen_wait_cancels(struct fake_gen *f, struct fake_gen_req *q, int count, int ms);

/* For play functions: delivers ev unless q was cancelled; false once it was. */
bool fake_gen_emit(struct fake_gen_req *q, const struct gen_event *ev);

/* For play functions: waits up to ms for q to be cancelled. */
void fake_gen_wait_cancel(struct fake_gen_req *q, int ms);

/* The scripts of enum fake_gen_script. */
void fake_gen_play_basic(struct fake_gen_req *q);

#endif
