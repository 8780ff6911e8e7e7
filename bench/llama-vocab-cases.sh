#!/usr/bin/env bash
# Regenerates the ids of tests/data/llama_vocab_cases.json with llama.cpp itself: every text of
# its "texts" through llama_tokenize(add_special = false, parse_special = false), as llama.cpp's
# test-tokenizer-0 does, on each models/ggml-vocab-*.gguf named in its "ids". llama.cpp's own
# .inp cases missed real differences (a Qwen 3.5 split without combining marks passed all 50),
# so these add texts that do catch them. Edit "texts" (or add a vocab with an empty list to
# "ids"), then run this.
# Usage: bench/llama-vocab-cases.sh   (builds llama.cpp first: bench/build-llamacpp.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(bench/build-llamacpp.sh)
src=$(bench/build-llamacpp.sh --source-only)
data=tests/data/llama_vocab_cases.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A vocab-only tokenizer: NUL-separated texts in, one line of ids per text out.
cat >"$work/tok.cpp" <<'EOF'
#include "llama.h"
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
int main(int argc, char ** argv) {
    if (argc != 3) return 2;
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * m = llama_model_load_from_file(argv[1], mp);
    if (!m) return 1;
    const llama_vocab * v = llama_model_get_vocab(m);
    std::ifstream f(argv[2], std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (size_t pos = 0, e; (e = all.find('\0', pos)) != std::string::npos; pos = e + 1) {
        const std::string s = all.substr(pos, e - pos);
        std::vector<llama_token> t(s.size() * 4 + 16);
        const int n = llama_tokenize(v, s.data(), s.size(), t.data(), t.size(), false, false);
        if (n < 0) return 3;
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", t[i]);
        printf("\n");
    }
    return 0;
}
EOF
g++ -O1 -std=c++17 "$work/tok.cpp" -I"$src/include" -I"$src/ggml/include" \
    "$build/src/libllama.a" "$build/ggml/src/libggml.a" "$build/ggml/src/libggml-cpu.a" \
    "$build/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -o "$work/tok"
python3 - "$data" "$src/models" "$work" <<'EOF'
import json, subprocess, sys
path, models, work = sys.argv[1:]
d = json.load(open(path, encoding="utf-8"))
with open(f"{work}/texts.bin", "wb") as f:
    for t in d["texts"]:
        assert "\0" not in t, "texts are NUL-separated for the tokenizer"
        f.write(t.encode("utf-8") + b"\0")
for vocab in d["ids"]:
    out = subprocess.run([f"{work}/tok", f"{models}/ggml-vocab-{vocab}.gguf", f"{work}/texts.bin"],
                         check=True, capture_output=True, text=True).stdout
    d["ids"][vocab] = [[int(i) for i in line.split()] for line in out.split("\n")[:-1]]
    assert len(d["ids"][vocab]) == len(d["texts"]), vocab
# One text, and one case's ids, per line: a regenerated file diffs line by line.
j = lambda x: json.dumps(x, ensure_ascii=False)
with open(path, "w", encoding="utf-8") as f:
    f.write('{\n "about": %s,\n "texts": [\n' % j(d["about"]))
    f.write(",\n".join("  " + j(t) for t in d["texts"]) + '\n ],\n "ids": {\n')
    f.write(",\n".join("  %s: [\n%s\n  ]" % (j(v), ",\n".join("   " + j(c) for c in cs))
                       for v, cs in d["ids"].items()) + "\n }\n}\n")
EOF
echo "$data: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(len(d['texts']), 'texts,', len(d['ids']), 'vocabs')" "$data")"
