/* dtype table: block sizes as ggml defines them, names both ways, row bytes. */
#include "base/dtype.h"
#include "testutil.h"

#include <string.h>

int main(void)
{
    /* Block geometry of the common types (ggml-common.h). */
    static const struct {
        int type;
        const char *name;
        int elems, bytes;
    } known[] = {
        {DT_F32, "F32", 1, 4},       {DT_F16, "F16", 1, 2},      {DT_BF16, "BF16", 1, 2},
        {DT_Q4_0, "Q4_0", 32, 18},   {DT_Q4_1, "Q4_1", 32, 20},  {DT_Q5_0, "Q5_0", 32, 22},
        {DT_Q5_1, "Q5_1", 32, 24},   {DT_Q8_0, "Q8_0", 32, 34},  {DT_Q2_K, "Q2_K", 256, 84},
        {DT_Q3_K, "Q3_K", 256, 110}, {DT_Q4_K, "Q4_K", 256, 144}, {DT_Q5_K, "Q5_K", 256, 176},
        {DT_Q6_K, "Q6_K", 256, 210}, {DT_Q8_K, "Q8_K", 256, 292}, {DT_IQ4_NL, "IQ4_NL", 32, 18},
        {DT_I8, "I8", 1, 1},         {DT_F64, "F64", 1, 8},      {DT_MXFP4, "MXFP4", 32, 17},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        const struct dtype_info *t = dtype_info(known[i].type);
        CHECK(t != NULL, "type %d has no info", known[i].type);
        if (!t)
            continue;
        CHECK(!strcmp(t->name, known[i].name), "type %d named %s, want %s", known[i].type, t->name, known[i].name);
        CHECK(t->block_elems == known[i].elems && t->block_bytes == known[i].bytes, "%s block %d/%d, want %d/%d",
              t->name, t->block_elems, t->block_bytes, known[i].elems, known[i].bytes);
        CHECK(!strcmp(dtype_name(known[i].type), known[i].name), "dtype_name(%d) = %s", known[i].type,
              dtype_name(known[i].type));
        CHECK_EQ_INT(dtype_from_name(known[i].name), known[i].type);
    }
    CHECK(dtype_info(DT_F32)->supported && dtype_info(DT_Q4_K)->supported, "F32/Q4_K not supported");

    /* Ids that name no type: holes left by removed types, negatives, past the end. */
    static const int unknown[] = {-1, 4, 5, 31, 32, 33, 36, 37, 38, DT_COUNT, 1000, -2147483647 - 1};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        CHECK(dtype_info(unknown[i]) == NULL, "id %d has info", unknown[i]);
        CHECK(!strcmp(dtype_name(unknown[i]), "unknown"), "id %d named %s", unknown[i], dtype_name(unknown[i]));
        CHECK_EQ_INT(dtype_row_bytes(unknown[i], 32), -1);
    }
    /* Every id that has info round-trips through its name. */
    int named = 0;
    for (int t = 0; t < DT_COUNT; t++)
        if (dtype_info(t)) {
            named++;
            CHECK_EQ_INT(dtype_from_name(dtype_name(t)), t);
        }
    CHECK_EQ_INT(named, 32);

    /* Names are case-insensitive; unknown names give -1. */
    CHECK_EQ_INT(dtype_from_name("q4_k"), DT_Q4_K);
    CHECK_EQ_INT(dtype_from_name("bf16"), DT_BF16);
    CHECK_EQ_INT(dtype_from_name("Q4_2"), -1);
    CHECK_EQ_INT(dtype_from_name(""), -1);
    CHECK_EQ_INT(dtype_from_name("F32 "), -1);
    CHECK_EQ_INT(dtype_from_name("unknown"), -1);

    /* Row bytes: whole blocks only. */
    CHECK_EQ_INT(dtype_row_bytes(DT_F32, 4096), 16384);
    CHECK_EQ_INT(dtype_row_bytes(DT_F16, 7), 14);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q4_0, 4096), 4096 / 32 * 18);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q4_0, 33), -1);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q4_K, 4096), 16 * 144);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q4_K, 128), -1);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q6_K, 256), 210);
    CHECK_EQ_INT(dtype_row_bytes(DT_Q8_0, 0), 0);
    CHECK_EQ_INT(dtype_row_bytes(DT_F32, -4), -1);
    CHECK_EQ_INT(dtype_row_bytes(DT_MXFP4, 64), 34);
    return test_main_end();
}
