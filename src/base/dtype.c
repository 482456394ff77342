#include "base/dtype.h"

#include <stddef.h>

#include <strings.h>

static const struct dtype_info table[DT_COUNT] = {
    [DT_F32] = {"F32", 1, 4, true},          [DT_F16] = {"F16", 1, 2, true},
    [DT_Q4_0] = {"Q4_0", 32, 18, true},      [DT_Q4_1] = {"Q4_1", 32, 20, true},
    [DT_Q5_0] = {"Q5_0", 32, 22, true},      [DT_Q5_1] = {"Q5_1", 32, 24, true},
    [DT_Q8_0] = {"Q8_0", 32, 34, true},      [DT_Q8_1] = {"Q8_1", 32, 36, false},
    [DT_Q2_K] = {"Q2_K", 256, 84, true},     [DT_Q3_K] = {"Q3_K", 256, 110, true},
    [DT_Q4_K] = {"Q4_K", 256, 144, true},    [DT_Q5_K] = {"Q5_K", 256, 176, true},
    [DT_Q6_K] = {"Q6_K", 256, 210, true},    [DT_Q8_K] = {"Q8_K", 256, 292, false},
    [DT_IQ2_XXS] = {"IQ2_XXS", 256, 66, false}, [DT_IQ2_XS] = {"IQ2_XS", 256, 74, false},
    [DT_IQ3_XXS] = {"IQ3_XXS", 256, 98, false}, [DT_IQ1_S] = {"IQ1_S", 256, 50, false},
    [DT_IQ4_NL] = {"IQ4_NL", 32, 18, true},  [DT_IQ3_S] = {"IQ3_S", 256, 110, false},
    [DT_IQ2_S] = {"IQ2_S", 256, 82, false},  [DT_IQ4_XS] = {"IQ4_XS", 256, 136, true},
    [DT_I8] = {"I8", 1, 1, false},           [DT_I16] = {"I16", 1, 2, false},
    [DT_I32] = {"I32", 1, 4, false},         [DT_I64] = {"I64", 1, 8, false},
    [DT_F64] = {"F64", 1, 8, false},         [DT_IQ1_M] = {"IQ1_M", 256, 56, false},
    [DT_BF16] = {"BF16", 1, 2, true},        [DT_TQ1_0] = {"TQ1_0", 256, 54, false},
    [DT_TQ2_0] = {"TQ2_0", 256, 66, false},  [DT_MXFP4] = {"MXFP4", 32, 17, true},
};

const struct dtype_info *dtype_info(int type)
{
    if (type < 0 || type >= DT_COUNT || !table[type].name)
        return 0;
    return &table[type];
}

const char *dtype_name(int type)
{
    const struct dtype_info *t = dtype_info(type);
    return t ? t->name : "unknown";
}

int dtype_from_name(const char *name)
{
    for (int i = 0; i < DT_COUNT; i++)
        if (table[i].name && !strcasecmp(table[i].name, name))
            return i;
    return -1;
}

int64_t dtype_row_bytes(int type, int64_t n)
{
    const struct dtype_info *t = dtype_info(type);
    if (!t || n < 0 || n % t->block_elems)
        return -1;
    return n / t->block_elems * t->block_bytes;
}

int dtype_kv_from_name(const char *name)
{
    int t = name ? dtype_from_name(name) : -1;
    return dtype_kv_name(t) ? t : -1;
}

const char *dtype_kv_name(int type)
{
    switch (type) {
    case DT_F16: return "f16";
    case DT_F32: return "f32";
    case DT_Q8_0: return "q8_0";
    case DT_Q4_0: return "q4_0";
    default: return NULL;
    }
}
