# usage: python3 tests/fuzz/mkvocab.py tests/fuzz/corpus/vocab
"""Writes small GGUF vocabularies (no tensors) as fuzz_vocab seeds."""
import struct, sys
out = sys.argv[1]
def s(x):
    b = x.encode() if isinstance(x, str) else x
    return struct.pack('<Q', len(b)) + b
T = {'u32': 4, 'i32': 5, 'f32': 6, 'bool': 7, 'str': 8, 'arr': 9}
def kv(key, typ, val):
    b = s(key) + struct.pack('<I', T[typ])
    if typ == 'str': b += s(val)
    elif typ == 'u32': b += struct.pack('<I', val)
    elif typ == 'i32': b += struct.pack('<i', val)
    elif typ == 'f32': b += struct.pack('<f', val)
    elif typ == 'bool': b += struct.pack('<B', val)
    else:
        et, items = val
        b += struct.pack('<IQ', T[et], len(items))
        for it in items:
            b += s(it) if et == 'str' else struct.pack({'i32': '<i', 'f32': '<f', 'u32': '<I'}[et], it)
    return b
def gguf(kvs):
    b = b'GGUF' + struct.pack('<IQQ', 3, 0, len(kvs)) + b''.join(kvs)
    return b + b'\0' * (-len(b) % 32)
def spm(extra_kv=()):
    toks = ['<unk>', '<s>', '</s>'] + ['<0x%02X>' % i for i in range(256)]
    types = [2, 3, 3] + [6] * 256
    words = ['\u2581', '\u2581a', 'a', 'b', 'ab', '\u2581hello', 'hello', '\u2581world', 'l', 'lo', '\u2581h', 'e', 'he', '<|im_start|>', '\u4e2d']
    toks += words; types += [1] * (len(words) - 2) + [3, 1]
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    return gguf([kv('general.architecture', 'str', 'llama'), kv('tokenizer.ggml.model', 'str', 'llama'),
                 kv('tokenizer.ggml.tokens', 'arr', ('str', toks)), kv('tokenizer.ggml.scores', 'arr', ('f32', scores)),
                 kv('tokenizer.ggml.token_type', 'arr', ('i32', types)), kv('tokenizer.ggml.bos_token_id', 'u32', 1),
                 kv('tokenizer.ggml.eos_token_id', 'u32', 2), kv('tokenizer.ggml.unknown_token_id', 'u32', 0),
                 kv('tokenizer.ggml.add_bos_token', 'bool', 1)] + list(extra_kv))
def byte_map():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]; n = 0
    for b in range(256):
        if b not in bs: bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}
def bpe(pre, extra_kv=()):
    m = byte_map()
    toks = [m[b] for b in range(256)]
    merges = ['\u0120 h', 'h e', 'l l', 'll o', 'he llo', '\u0120 w', 'o r', '\u0120w or', 'l d', '\u0120wor ld', '1 2', '12 3', '\u0120 \u0120']
    toks += ['\u0120h', 'he', 'll', 'llo', 'hello', '\u0120w', 'or', '\u0120wor', 'ld', '\u0120world', '12', '123', '\u0120\u0120']
    types = [1] * len(toks)
    toks += ['<|endoftext|>', '<|im_start|>', '<|im_end|>']; types += [3, 3, 3]
    return gguf([kv('general.architecture', 'str', 'qwen2'), kv('tokenizer.ggml.model', 'str', 'gpt2'),
                 kv('tokenizer.ggml.pre', 'str', pre), kv('tokenizer.ggml.tokens', 'arr', ('str', toks)),
                 kv('tokenizer.ggml.token_type', 'arr', ('i32', types)), kv('tokenizer.ggml.merges', 'arr', ('str', merges)),
                 kv('tokenizer.ggml.eos_token_id', 'u32', len(toks) - 3), kv('tokenizer.ggml.eot_token_id', 'u32', len(toks) - 1)]
                + list(extra_kv))
open(out + '/spm', 'wb').write(spm())
open(out + '/spm-no-space-prefix-eos', 'wb').write(spm([kv('tokenizer.ggml.add_space_prefix', 'bool', 0), kv('tokenizer.ggml.add_eos_token', 'bool', 1)]))
open(out + '/bpe-qwen2', 'wb').write(bpe('qwen2'))
open(out + '/bpe-llama3', 'wb').write(bpe('llama-bpe', [kv('tokenizer.ggml.add_bos_token', 'bool', 1), kv('tokenizer.ggml.bos_token_id', 'u32', 256)]))
open(out + '/bpe-default', 'wb').write(bpe('default'))
