// Reference vectors from llama.cpp for one model file: what edgellm's tests hold its tokenizer
// and forward pass to (tests/data/<model>/). Built against the llama.cpp that
// bench/build-llamacpp.sh builds, by bench/llamacpp-vectors.sh, which also renders the chat
// prompts and writes the JSON files the tests read.
//
// Usage: llamacpp-vectors MODEL.gguf CASES.json N_GREEDY > OUT.json
//   CASES.json: {"tokenize": ["text", ...],
//                "prompts": [{"id": "...", "prompt": "...", "parse_special": bool}, ...]}
//   OUT.json:   {"chat_template": "...", "eog": [ids], "n_vocab": N,
//                "tokenize": [{"text", "ids", "pieces_hex"}],
//                "prompts":  [{"id", "prompt_ids", "top10": [[id, logit]], "logsumexp",
//                              "generated_ids", "top1_logit", "top1_margin"}]}
// Env: VECTORS_PRECISE=1 runs llama.cpp's precise path (f32 KV cache, flash attention off)
//      instead of its default (f16 KV, flash attention auto); VECTORS_THREADS (default 1).
// Greedy: argmax of the raw logits, ties to the lowest id; the prompt is decoded as one batch,
// then one token per llama_decode; generation stops after an end-of-generation token.
#include "llama.h"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

using json = nlohmann::ordered_json;

static std::vector<llama_token> tokenize(const llama_vocab *vocab, const std::string &text,
                                         bool add_special, bool parse_special) {
    int n = -llama_tokenize(vocab, text.data(), (int)text.size(), nullptr, 0, add_special,
                            parse_special);
    std::vector<llama_token> ids(std::max(n, 0));
    if (n > 0) {
        llama_tokenize(vocab, text.data(), (int)text.size(), ids.data(), n, add_special,
                       parse_special);
    }
    return ids;
}

static std::string piece(const llama_vocab *vocab, llama_token id) {
    char buf[512];
    int n = llama_token_to_piece(vocab, id, buf, sizeof buf, 0, true);
    return n > 0 ? std::string(buf, n) : std::string();
}

static std::string hex(const std::string &s) {
    static const char *d = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) {
        out += d[c >> 4];
        out += d[c & 15];
    }
    return out;
}

// The top `k` [id, logit] by logit, ties to the lower id.
static json top_k(const float *logits, int n_vocab, int k) {
    std::vector<int> idx(n_vocab);
    for (int i = 0; i < n_vocab; i++) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    json out = json::array();
    for (int i = 0; i < k; i++) out.push_back({idx[i], logits[idx[i]]});
    return out;
}

static double logsumexp(const float *logits, int n_vocab) {
    double m = logits[0];
    for (int i = 1; i < n_vocab; i++) m = std::max(m, (double)logits[i]);
    double s = 0;
    for (int i = 0; i < n_vocab; i++) s += std::exp(logits[i] - m);
    return m + std::log(s);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf CASES.json N_GREEDY\n", argv[0]);
        return 2;
    }
    const bool precise = getenv("VECTORS_PRECISE") && std::string(getenv("VECTORS_PRECISE")) == "1";
    const int threads = getenv("VECTORS_THREADS") ? atoi(getenv("VECTORS_THREADS")) : 1;
    const int n_greedy = atoi(argv[3]);
    std::ifstream in(argv[2]);
    json cases = json::parse(in);

    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model_params mp = llama_model_default_params();
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    json out;
    const char *tmpl = llama_model_chat_template(model, nullptr);
    out["chat_template"] = tmpl ? tmpl : "";
    json eog = json::array();
    for (int i = 0; i < n_vocab; i++)
        if (llama_vocab_is_eog(vocab, i)) eog.push_back(i);
    out["eog"] = eog;
    out["n_vocab"] = n_vocab;
    out["add_bos"] = llama_vocab_get_add_bos(vocab);

    out["tokenize"] = json::array();
    for (const auto &t : cases.value("tokenize", json::array())) {
        std::string text = t.get<std::string>();
        auto ids = tokenize(vocab, text, false, false);
        json pieces = json::array();
        std::string joined;
        for (auto id : ids) {
            std::string p = piece(vocab, id);
            pieces.push_back(hex(p));
            joined += p;
        }
        std::string detok(text.size() * 4 + 64, '\0');
        int n = llama_detokenize(vocab, ids.data(), (int)ids.size(), detok.data(),
                                 (int)detok.size(), false, false);
        detok.resize(std::max(n, 0));
        json rec = {{"text", text},
                    {"ids", ids},
                    {"pieces_hex", pieces},
                    {"detokenized", detok},
                    {"roundtrip_exact", joined == text}};
        // Control tokens typed in the text are only control tokens when parsed as such.
        auto special = tokenize(vocab, text, false, true);
        if (special != ids) rec["ids_parse_special"] = special;
        out["tokenize"].push_back(rec);
    }

    out["prompts"] = json::array();
    for (const auto &c : cases.value("prompts", json::array())) {
        const std::string prompt = c["prompt"];
        const bool parse_special = c.value("parse_special", false);
        auto ids = tokenize(vocab, prompt, true, parse_special);
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 1024;
        cp.n_batch = 1024;
        cp.n_ubatch = 512;
        cp.n_threads = threads;
        cp.n_threads_batch = threads;
        if (precise) {
            cp.type_k = GGML_TYPE_F32;
            cp.type_v = GGML_TYPE_F32;
            cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        }
        llama_context *ctx = llama_init_from_model(model, cp);
        if (!ctx || ids.empty() || llama_decode(ctx, llama_batch_get_one(ids.data(), (int)ids.size()))) {
            fprintf(stderr, "%s: decode failed\n", c["id"].get<std::string>().c_str());
            return 1;
        }
        const float *logits = llama_get_logits_ith(ctx, -1);
        json rec = {{"id", c["id"]},
                    {"prompt_ids", ids},
                    {"top10", top_k(logits, n_vocab, 10)},
                    {"logsumexp", logsumexp(logits, n_vocab)}};
        json gen = json::array(), top1 = json::array(), margin = json::array();
        for (int step = 0; step < n_greedy; step++) {
            json best = top_k(logits, n_vocab, 2);
            llama_token id = best[0][0];
            gen.push_back(id);
            top1.push_back(best[0][1]);
            margin.push_back(best[0][1].get<float>() - best[1][1].get<float>());
            if (llama_vocab_is_eog(vocab, id) || step + 1 == n_greedy) break;
            if (llama_decode(ctx, llama_batch_get_one(&id, 1))) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
            logits = llama_get_logits_ith(ctx, -1);
        }
        rec["generated_ids"] = gen;
        rec["top1_logit"] = top1;
        rec["top1_margin"] = margin;
        std::string text;
        for (auto &g : gen) text += piece(vocab, g.get<llama_token>());
        rec["generated_text"] = text;
        out["prompts"].push_back(rec);
        llama_free(ctx);
    }
    llama_model_free(model);
    printf("%s\n", out.dump(1).c_str());
    return 0;
}
