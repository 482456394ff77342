/* A straightforward float64 forward pass over a whole sequence, written from the
 * architectures' definitions (not from src/engine), for checking the engine. Reads the
 * GGUF with the reader and dequantizes every tensor to double. */
#ifndef CAIRN_TEST_REF_FORWARD_H
#define CAIRN_TEST_REF_FORWARD_H

#include <stdint.h>

/* Logits (n x n_vocab, row per position) of tokens[0..n) as one sequence from position 0.
 * Returns NULL on failure (message printed). Caller frees. */
double *ref_forward(const char *model_path, const int32_t *tokens, int n, int *n_vocab_out);

#endif
