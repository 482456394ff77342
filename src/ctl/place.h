/* Placement: a pure function from (nodes, links, model card, sharding, min/max nodes)
 * to every candidate node set it considered, each accepted with a per-node layer range
 * and memory breakdown or refused with a reason a person can read. It depends on no
 * other cluster module: the caller maps the cluster state onto these plain structs.
 *
 * Memory a node can give:  free = available - held  (0 when held >= available), where
 * available is what the node may offer (min(OS available, --memory-limit)) and held is
 * what instances already placed on it hold (mapped model pages count as held).
 *
 * Pipeline: ranks 0..k-1 hold contiguous layer ranges [begin, end) covering 0..n_layers,
 * at least one layer each, split in proportion to free memory (largest remainder). A rank
 * needs: its layers' bytes + KV (kv_bytes_per_token_layer * ctx_len * n_slots per layer,
 * window_positions instead of ctx_len * n_slots for a sliding-window layer); rank 0 also the embedding and the draft model with its KV; the last rank the
 * output norm and the head (a tied head is the embedding matrix, so the last rank holds a
 * second copy unless it is rank 0). When the proportional split does not fit, layers move
 * toward nodes with slack: the fitting split with the lowest max need/free (found by an
 * exact O(k * n_layers) reachability search, nearest the proportional boundaries); only
 * when no contiguous split fits is the order refused. Beyond 2^18 ranks x layers the
 * search is a greedy front-to-back fill, which can miss a split. Consecutive ranks must
 * be linked.
 *
 * Tensor (runs since issue 22, at most PLACE_TENSOR_MAX nodes): of k > 1, every node holds
 * 1/k of the layers' and the head's bytes (a rank loads only its rows of every matrix), 4
 * norm-sized vectors per layer whole, of a tied embedding 1/k (its head rows; the lookup
 * reads rows from the file), and 1/k of the KV (each rounded up); one node (k = 1) the
 * whole model; rank 0 the draft. n_head and n_head_kv must divide by k, and every
 * pair of nodes must be linked.
 *
 * Enumeration (bounded: 2^n subsets are never listed): nodes are ranked by free memory
 * (most first, ties by id). For each size k = min_nodes .. min(max_nodes, n) (pipeline:
 * also <= n_layers), k-subsets are visited best-first in decreasing total free memory
 * (ties: lexicographic in that ranking), each size getting an equal share of what is
 * left of max_candidates (unused shares roll over to larger sizes). A size stops early
 * when a subset's total free memory is below what k ranks need together (no later
 * subset can fit) and, for tensor, when the heads do not divide by k (one refused
 * candidate says so). Pipeline orders within a subset: up to PLACE_MAX_ORDERS paths
 * through linked nodes found by depth-first search starting from the nodes with most
 * free memory and stepping to the lowest-rtt neighbour first (at most PLACE_DFS_STEPS
 * steps); among the orders that fit, lowest max rtt, then lowest total rtt, then first
 * found. Small clusters (C(n,k) within the budget) are therefore searched exhaustively.
 *
 * Best candidate policy: among accepted candidates, fewest nodes; then most free memory
 * left after placement (sum over its nodes); then lowest max rtt between linked ranks;
 * then lowest total rtt; then the first examined. */
#ifndef CAIRN_CTL_PLACE_H
#define CAIRN_CTL_PLACE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define PLACE_MAX_NODES 256
#define PLACE_MAX_ID 255                      /* bytes of a node id, without the NUL */
#define PLACE_MAX_LAYERS 65536
#define PLACE_BYTES_MAX ((uint64_t)1 << 52)   /* 4 PiB: bound on every byte count given */
#define PLACE_DEFAULT_CANDIDATES 256          /* max_candidates when the request says 0 */
#define PLACE_MAX_CANDIDATES 4096
#define PLACE_MAX_ORDERS 24                   /* pipeline orders tried per node set (all of 4 nodes) */
#define PLACE_DFS_STEPS 20000                 /* path search steps per node set */
#define PLACE_REASON_MAX 512

enum place_sharding { PLACE_PIPELINE = 0, PLACE_TENSOR = 1 };
#define PLACE_TENSOR_MAX 8 /* ranks of a tensor-parallel instance (engine.h's ENGINE_TP_MAX) */

struct place_node {
    const char *id;     /* unique, 1..PLACE_MAX_ID bytes */
    uint64_t available; /* bytes this node may offer: min(OS available, --memory-limit) */
    uint64_t held;      /* bytes held by instances already placed here (mapped pages too) */
    uint64_t total;     /* total memory, reported only */
};

/* A link in either direction connects the pair; with several, the lowest rtt counts.
 * Links naming a node not in the request (or a node to itself) are ignored. */
struct place_link {
    const char *from, *to;
    uint32_t rtt_us;
};

struct place_model {
    const char *id;                    /* for the JSON only; may be NULL */
    uint32_t n_layers;                 /* 1..PLACE_MAX_LAYERS */
    uint64_t layer_bytes;              /* bytes of each layer when layer_bytes_each is NULL */
    const uint64_t *layer_bytes_each;  /* n_layers entries (quant mixes differ), or NULL */
    uint64_t embed_bytes;              /* token embedding, on rank 0 */
    uint64_t head_bytes;               /* output matrix, on the last rank; unused when tied */
    int tied;                          /* head is the embedding matrix */
    uint64_t norm_bytes;               /* output norm, on the last rank */
    uint64_t kv_bytes_per_token_layer; /* K and V of one token in one layer */
    uint32_t ctx_len;                  /* >= 1 */
    uint32_t n_slots;                  /* sequences held at once, >= 1 */
    const uint8_t *layer_window;       /* n_layers flags: sliding-window layers, or NULL */
    uint64_t window_positions;         /* positions a sliding-window layer's KV keeps resident,
                                          <= ctx_len * n_slots (proto/runner_proto.h) */
    uint32_t n_head, n_head_kv;        /* for tensor sharding; 0 = unknown (refused) */
    uint32_t n_expert;                 /* a mixture of experts (tensor sharding refuses it); 0 = dense */
    uint64_t draft_bytes;              /* draft model weights on rank 0; 0 = no draft */
    uint64_t draft_kv_bytes_per_token; /* draft KV of one token over all its layers */
};

struct place_request {
    const struct place_node *nodes;
    size_t n_nodes; /* 0..PLACE_MAX_NODES */
    const struct place_link *links;
    size_t n_links;
    struct place_model model;
    enum place_sharding sharding;
    uint32_t min_nodes;      /* >= 1 */
    uint32_t max_nodes;      /* 0 = no limit; else >= min_nodes */
    uint32_t max_candidates; /* 0 = PLACE_DEFAULT_CANDIDATES; at most PLACE_MAX_CANDIDATES */
};

/* Bytes one node needs; head includes the output norm, draft includes the draft's KV. */
struct place_need {
    uint64_t layers, embedding, head, kv, draft, total;
};

struct place_share {
    size_t node;     /* index into the request's nodes */
    const char *id;  /* the node's id (owned by the result) */
    uint32_t rank;
    uint32_t layer_begin, layer_end; /* [begin, end); tensor: 0..n_layers */
    uint64_t free;   /* available - held */
    struct place_need need;
};

struct place_candidate {
    uint32_t n_nodes;
    struct place_share *shares; /* n_nodes entries in rank order */
    int accepted;
    int executable;   /* 1: the runners can run it (every candidate since tensor parallelism runs) */
    char reason[PLACE_REASON_MAX]; /* why refused; "" when accepted */
    uint64_t free_left;  /* accepted: sum of free - need over its nodes */
    uint32_t max_rtt_us; /* over linked ranks it uses (pipeline: consecutive; tensor: all) */
    uint64_t sum_rtt_us;
};

struct place_result {
    enum place_sharding sharding;
    uint32_t min_nodes, max_nodes, max_candidates; /* as applied (max_nodes capped at n) */
    struct place_candidate *cands; /* in the order examined */
    size_t n_cands;
    long best;      /* index into cands of the best accepted candidate, -1 when none */
    int truncated;  /* 1 when the candidate budget cut a size short */
    char *model_id; /* copy, may be NULL */
    char *ids;      /* storage behind every share's id */
};

/* Computes every candidate for req into *out (caller-owned, released with
 * place_result_free even on failure). Returns 0, or CAIRN_EINVAL / CAIRN_ERANGE for a
 * malformed request (message in err), CAIRN_ENOMEM. No candidate being accepted is
 * not an error: out->best is -1 and each refusal says why. Pure and deterministic. */
int place_compute(const struct place_request *req, struct place_result *out, char *err,
                  size_t errlen);

/* Releases what place_compute allocated in *res and zeroes it; NULL is accepted. */
void place_result_free(struct place_result *res);

/* New JSON object for GET /instance/previews: policy, best, candidates with nodes,
 * per-node layer range and memory, accepted or reason. NULL when out of memory. */
json_t *place_result_to_json(const struct place_result *res);

/* "pipeline" or "tensor" (case-sensitive) into *out; CAIRN_EINVAL otherwise. */
int place_sharding_parse(const char *s, enum place_sharding *out);

/* Static name of a sharding ("pipeline", "tensor", "unknown"). */
const char *place_sharding_name(enum place_sharding s);

#endif
