#!/usr/bin/env bash
# Makes llama.cpp's reference vectors for one model file, the ones tests/data/<dir>/ keeps:
# tokenize.json (ids of texts), greedy.json (greedy continuations of raw and chat prompts, with
# each step's top-1 margin) and logits.json (the top-10 logits after each prompt), each from
# llama.cpp's default path (f16 KV, flash attention auto) and its precise one (f32 KV, flash
# attention off), whose disagreement is the floor of any tolerance.
#
# Usage: bench/llamacpp-vectors.sh MODEL.gguf CASES.json OUT_DIR [N_GREEDY]
#   CASES.json: bench/vectors/*.json ({"tokenize": [...], "raw": [...], "chat": [{messages}]})
# Chat prompts are the model file's own template rendered by Python's jinja2 the way Hugging
# Face's apply_chat_template renders it, and tokenized with control tokens parsed.
# Needs bench/build-llamacpp.sh's build (the libraries), g++ and python3 (jinja2 is installed
# into a venv in the cache).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { echo "usage: $0 MODEL.gguf CASES.json OUT_DIR [N_GREEDY]" >&2; exit 2; }
model=$1 cases=$2 out=$3 n_greedy=${4:-32}
cache="${EDGELLM_CACHE:-$HOME/.cache/edgellm}"
build=$(bench/build-llamacpp.sh)
src=$(bench/build-llamacpp.sh --source-only)
tool="$build/bin/llamacpp-vectors"
if [ ! -x "$tool" ] || [ bench/llamacpp-vectors.cpp -nt "$tool" ]; then
    echo "vectors: building $tool" >&2
    libs=()
    for l in src/libllama.a ggml/src/libggml.a ggml/src/libggml-cpu.a ggml/src/libggml-base.a; do
        libs+=("$build/$l")
    done
    g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" -I"$src/vendor" \
        bench/llamacpp-vectors.cpp "${libs[@]}" -fopenmp -lpthread -o "$tool"
fi
venv="$cache/venv-jinja2"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c 'import jinja2' 2>/dev/null || "$venv/bin/pip" install --quiet jinja2==3.1.6
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

# 1. The model's template and end-of-generation ids.
echo '{}' >"$work/none.json"
"$tool" "$model" "$work/none.json" 0 >"$work/meta.json"
# 2. The prompts: raw texts as they are, chat conversations rendered with jinja2.
"$venv/bin/python" - "$cases" "$work/meta.json" "$work/cases.json" <<'EOF'
import json, sys
from datetime import datetime
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
cases = json.load(open(sys.argv[1]))
meta = json.load(open(sys.argv[2]))
def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=ensure_ascii)
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)
tmpl = env.from_string(meta["chat_template"]) if meta["chat_template"] else None
prompts = []
for i, text in enumerate(cases.get("raw", [])):
    prompts.append({"id": f"raw-{i:02}", "kind": "raw", "prompt": text, "parse_special": False})
for i, chat in enumerate(cases.get("chat", [])):
    text = tmpl.render(messages=chat["messages"], add_generation_prompt=True, tools=None,
                       bos_token="", eos_token="")
    prompts.append({"id": f"chat-{i:02}", "kind": "chat", "messages": chat["messages"],
                    "prompt": text, "parse_special": True})
json.dump({"tokenize": cases.get("tokenize", []), "prompts": prompts},
          open(sys.argv[3], "w"), ensure_ascii=False)
EOF
# 3. Both paths.
VECTORS_PRECISE=0 "$tool" "$model" "$work/cases.json" "$n_greedy" >"$work/default.json"
VECTORS_PRECISE=1 "$tool" "$model" "$work/cases.json" "$n_greedy" >"$work/precise.json"
# 4. The files the tests read.
commit=$(cd "$src" && git rev-parse --short HEAD 2>/dev/null || echo 0c1e57098)
python3 - "$model" "$work/cases.json" "$work/default.json" "$work/precise.json" "$out" "$commit" <<'EOF'
import hashlib, json, os, sys
model, cases, default, precise, out, commit = sys.argv[1:]
cases = json.load(open(cases))["prompts"]
d, p = json.load(open(default)), json.load(open(precise))
h = hashlib.sha256()
with open(model, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
head = {
    "engine": f"llama.cpp {commit} (bench/build-llamacpp.sh), CPU, 1 thread, n_ctx 1024, n_batch 1024, n_ubatch 512",
    "model_file": os.path.basename(model),
    "model_sha256": h.hexdigest(),
    "made_by": "bench/llamacpp-vectors.sh",
    "eog": d["eog"],
    "add_bos": d["add_bos"],
    "default_path": "f16 KV cache, flash attention auto",
    "precise_path": "f32 KV cache, flash attention off",
}
def write(name, body):
    with open(os.path.join(out, name), "w") as f:
        json.dump({**head, **body}, f, ensure_ascii=False, indent=1)
        f.write("\n")
write("tokenize.json", {
    "what": "llama_tokenize(add_special=false, parse_special=false) ids, and each id's piece (llama_token_to_piece, special=true) in hex",
    "cases": [{"id": f"tok-{i:02}", **t} for i, t in enumerate(d["tokenize"])],
})
greedy, logits = [], []
for c, a, b in zip(cases, d["prompts"], p["prompts"]):
    agree = 0
    for x, y in zip(a["generated_ids"], b["generated_ids"]):
        if x != y:
            break
        agree += 1
    rec = {k: c[k] for k in ("id", "kind", "prompt", "parse_special")}
    if "messages" in c:
        rec["messages"] = c["messages"]
    rec["prompt_ids"] = a["prompt_ids"]
    greedy.append({**rec, "generated_ids": a["generated_ids"], "generated_text": a["generated_text"],
                   "top1_logit": a["top1_logit"], "top1_margin": a["top1_margin"],
                   "agree_prefix_with_kv_f32_fa_off": agree})
    # The spread between llama.cpp's two paths over the default path's top-10.
    pl = dict((t, v) for t, v in b["top10"])
    spread = max((abs(v - pl[t]) for t, v in a["top10"] if t in pl), default=0.0)
    logits.append({**rec, "top10": {"default": a["top10"]}, "logsumexp": {"default": a["logsumexp"]},
                   "top10_kv_f32_fa_off": {"default": b["top10"]},
                   "max_abs_logit_diff_default_vs_kv_f32_fa_off": {"default": round(spread, 5)}})
write("greedy.json", {
    "what": "greedy (argmax, ties to the lowest id) continuation of each prompt, stopping after an end-of-generation token",
    "fields": {"top1_margin": "chosen logit minus the runner-up's at each step",
               "agree_prefix_with_kv_f32_fa_off": "leading generated ids the precise path also gives"},
    "cases": greedy,
})
write("logits.json", {
    "what": "top-10 [id, logit] after the whole prompt (one batch), on both paths",
    "cases": logits,
})
EOF
echo "vectors: $(ls "$out" | tr '\n' ' ')in $out" >&2
