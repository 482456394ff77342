/* What a runner says of a task, typed: the start, output, seq_done and done lines of
 * proto/runner_proto.h, which the node relays to the node whose API holds the request.
 * The runner and the worker write them with task_msg_to_json; the supervisor and the
 * requester's node read them with task_msg_decode, which checks every member it uses
 * (type, range, presence) and refuses the line naming the member, so a bad line is never
 * read as zeros. Unknown members are ignored (a newer runner may add some).
 *
 * Lines:
 *   {"type":"start","task_id","prompt_tokens","cached_tokens","stats"?}
 *   {"type":"start","task_id","error","status"}       refused before it began (status 400..599)
 *   {"type":"output","task_id","seq","content","reasoning","logprobs":[...]?}
 *   {"type":"seq_done","task_id","seq","finish","stop_sequence":text|null,
 *    "tool_calls":[...]|null,"completion_tokens","prompt_tokens","cached_tokens",
 *    "draft_tokens","accepted_draft_tokens","prompt_ms"?,"predicted_ms"?,"stats"?}
 *   {"type":"done","task_id","finish":"stop"|"length"|"cancelled"|"error","n_generated",
 *    "error":text|null}
 *   {"type":"embedding","task_id","index","prompt_tokens","embedding":base64}
 *     an embedding task's vector of input `index` (0..TEXTGEN_MAX_EMBED_INPUTS - 1, the
 *     receiver checks it against its request), the input's tokens, and the vector as
 *     little-endian float32 values in standard base64 (what OpenAI's encoding_format
 *     "base64" returns), 1..TEXTGEN_MAX_EMBED_DIM finite values
 * "stats" is the runner's scheduler at that moment (struct task_stats). */
#ifndef CAIRN_PROTO_TASKMSG_H
#define CAIRN_PROTO_TASKMSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "proto/ids.h"
#include "proto/runner_proto.h"
#include "proto/textgen.h"

/* How one sequence ended (seq_done's "finish"). */
enum task_seq_finish {
    TASK_SEQ_STOP,
    TASK_SEQ_LENGTH,
    TASK_SEQ_TOOL_CALLS,
    TASK_SEQ_CANCELLED,
    TASK_SEQ_ERROR,
    TASK_SEQ_FINISH_COUNT
};

/* A runner's scheduler, as the node's /metrics shows it (0..IDS_COUNTER_MAX each). */
struct task_stats {
    int64_t running, queued, slots, kv_blocks_used, kv_blocks_total, preemptions;
    bool pipeline; /* rank 0 of a pipeline: the members below are set */
    int64_t pipeline_steps, pipeline_compute_us, pipeline_wait_us, pipeline_bytes, pipeline_result_bytes,
        pipeline_rows_sampled, pipeline_rows_logits;
    int64_t pipeline_sealed_bytes; /* rank 0's bytes sent in sealed (encrypted) frames */
};

struct task_msg {
    enum runner_msg_type type; /* RUNNER_MSG_START, _OUTPUT, _SEQ_DONE or _DONE */
    char task_id[IDS_ID_MAX + 1];
    bool has_stats; /* START, SEQ_DONE */
    struct task_stats stats;
    /* START (and SEQ_DONE's copies) */
    int64_t prompt_tokens, cached_tokens;
    int status;        /* START refused: its HTTP status; 0 otherwise */
    const char *error; /* START refused, DONE: text or NULL */
    /* OUTPUT and SEQ_DONE */
    int seq; /* 0..RUNNER_MAX_SEQS - 1 (the receiver checks it against its request) */
    const char *content, *reasoning; /* OUTPUT: "" when none */
    const json_t *logprobs;          /* OUTPUT: an array, or NULL */
    enum task_seq_finish seq_finish; /* SEQ_DONE */
    const char *stop_sequence;       /* SEQ_DONE: or NULL */
    const json_t *tool_calls;        /* SEQ_DONE: an array, or NULL */
    int64_t completion_tokens, draft_tokens, accepted_draft_tokens; /* SEQ_DONE */
    double prompt_ms, predicted_ms;  /* SEQ_DONE: 0 = not known */
    /* EMBEDDING (and prompt_tokens above) */
    int index;
    const char *embedding; /* base64, checked: whole float32 values */
    int dim;               /* values in it */
    /* DONE */
    enum runner_finish finish;
    int64_t n_generated;
    json_t *root; /* a decoded message owns its strings and arrays here */
};

/* Static "stop", "length", "tool_calls", "cancelled", "error"; NULL out of range. */
const char *task_seq_finish_name(int v);

/* Reads one line (a trailing '\n' allowed) into *out. CAIRN_EFORMAT with the member named
 * in err ("output.seq: 2147483648 is out of range ...") for anything but a well-formed
 * task line; CAIRN_ENOMEM. out needs task_msg_clear after success. */
int task_msg_decode(const char *line, size_t len, struct task_msg *out, char *err, size_t errlen);

/* As task_msg_decode from a parsed line (out holds a reference to j). */
int task_msg_from_json(json_t *j, struct task_msg *out, char *err, size_t errlen);

/* The line of m as a new JSON object (type and task_id included); NULL when out of memory
 * or when m holds a value no reader would take. */
json_t *task_msg_to_json(const struct task_msg *m);

/* The base64 text of n float32 values (malloc'd, NUL-terminated); NULL when out of memory. */
char *task_embedding_encode(const float *v, int n);

/* Decodes m->embedding (an EMBEDDING message) into out (m->dim values). CAIRN_EFORMAT
 * when a value is not finite. */
int task_embedding_decode(const struct task_msg *m, float *out, char *err, size_t errlen);

/* Releases what a decoded message owns and zeroes it. */
void task_msg_clear(struct task_msg *m);

#endif
