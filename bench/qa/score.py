#!/usr/bin/env python3
"""The answer-quality benchmark's scorer (bench/qa/README.md has the format and the rules).

  score.py --self-test                       check the question set and the scorer itself
  score.py --list [--only IDS]               the questions to ask, one "id<TAB>question" a line
  score.py --record ID RC OUT ERR SECONDS    one answers line from an `edgellm ask --json` run
  score.py --answers FILE [--model NAME] [--seconds S] [--json-out FILE] [--only IDS]
                                             the report: total, per category, per language, misses

An answer is right when one of the question's `accept` patterns matches it and none of its
`reject` patterns does; patterns are Python regular expressions, searched anywhere in the
answer, case-insensitively. An error (no answer) is a miss.
"""

import argparse
import json
import os
import re
import sys
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_QUESTIONS = os.path.join(HERE, "questions.jsonl")
CATEGORIES = ("facts", "units", "arithmetic", "industrial", "triage", "instructions")
LANGS = ("en", "zh")
FLAGS = re.IGNORECASE
# What the set promises (README.md); the self-test keeps it true.
MIN_QUESTIONS, MIN_ZH, MIN_WITH_EXAMPLES = 90, 15, 20


def load_questions(path):
    """The questions of a JSON-lines file, in file order; a malformed line stops with its number."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
            except ValueError as e:
                sys.exit(f"{path}:{n}: not JSON: {e}")
            q["_line"] = n
            out.append(q)
    return out


def select(questions, only):
    """The questions named by --only (comma-separated ids), all without it. An unknown id is
    an error: a typo must not quietly shrink the run."""
    if not only:
        return questions
    want = [i for i in only.split(",") if i]
    known = {q["id"] for q in questions}
    unknown = [i for i in want if i not in known]
    if unknown:
        sys.exit(f"score: unknown question id(s): {', '.join(unknown)}")
    return [q for q in questions if q["id"] in want]


def judge(q, answer):
    """(right, why): whether `answer` is right for question `q`, and for a wrong one what
    decided it (no accept matched, or the reject pattern that matched)."""
    if answer is None:
        return False, "no answer"
    if not any(re.search(p, answer, FLAGS) for p in q["accept"]):
        return False, "no accept pattern matched"
    for p in q.get("reject", []):
        if re.search(p, answer, FLAGS):
            return False, f"reject pattern matched: {p}"
    return True, ""


# ---------------------------------------------------------------- self-test

def self_test(path):
    questions = load_questions(path)
    problems = []

    def bad(q, msg):
        problems.append(f"{path}:{q.get('_line', '?')} {q.get('id', '?')}: {msg}")

    seen = set()
    for q in questions:
        for key, kind in (("id", str), ("category", str), ("lang", str), ("question", str), ("accept", list)):
            if not isinstance(q.get(key), kind):
                bad(q, f"'{key}' missing or not a {kind.__name__}")
        if problems and problems[-1].startswith(f"{path}:{q['_line']} "):
            continue
        extra = set(q) - {"id", "category", "lang", "question", "accept", "reject", "examples", "_line"}
        if extra:
            bad(q, f"unknown field(s) {sorted(extra)}")
        if q["id"] in seen:
            bad(q, "duplicate id")
        seen.add(q["id"])
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", q["id"]):
            bad(q, "id: lower-case letters, digits, '-' and '.' only (QA_ONLY splits on ',')")
        if q["category"] not in CATEGORIES:
            bad(q, f"category {q['category']!r} not one of {CATEGORIES}")
        if q["lang"] not in LANGS:
            bad(q, f"lang {q['lang']!r} not one of {LANGS}")
        if not q["question"].strip() or re.search(r"[\t\r\n]", q["question"]):
            bad(q, "question empty or holding a tab or line break (qa.sh reads id<TAB>question lines)")
        if not q["accept"]:
            bad(q, "no accept pattern")
        for p in q["accept"] + q.get("reject", []):
            try:
                re.compile(p, FLAGS)
            except (re.error, TypeError) as e:
                bad(q, f"pattern {p!r} does not compile: {e}")
        ex = q.get("examples")
        if ex is None:
            continue
        if not isinstance(ex, dict) or set(ex) - {"right", "wrong"}:
            bad(q, "examples: an object with 'right' and/or 'wrong' lists")
            continue
        try:
            for label, want in (("right", True), ("wrong", False)):
                for answer in ex.get(label, []):
                    got, why = judge(q, answer)
                    if got != want:
                        bad(q, f"example {answer!r} is labelled {label} but scored "
                               f"{'right' if got else 'wrong'}" + (f" ({why})" if why else ""))
        except re.error:
            pass  # reported above

    # The scorer's own edge cases, on a made-up question.
    probe = {"accept": [r"\b100\b"], "reject": [r"\b212\b\s*°?\s*C"]}
    for answer, want in (("100 °C", True), ("212 °C", False), ("100 °C, not 212 °C", False),
                         ("", False), (None, False), ("1000", False)):
        if judge(probe, answer)[0] != want:
            problems.append(f"scorer: {answer!r} should be {'right' if want else 'wrong'}")

    n_zh = sum(q.get("lang") == "zh" for q in questions)
    n_ex = sum("examples" in q for q in questions)
    n_cases = sum(len(q.get("examples", {}).get(k, [])) for q in questions for k in ("right", "wrong"))
    for what, have, need in (("questions", len(questions), MIN_QUESTIONS), ("zh questions", n_zh, MIN_ZH),
                             ("questions with examples", n_ex, MIN_WITH_EXAMPLES)):
        if have < need:
            problems.append(f"{path}: {have} {what}, at least {need} wanted")
    for c in CATEGORIES:
        for lang in LANGS:
            if not any(q.get("category") == c and q.get("lang") == lang for q in questions):
                problems.append(f"{path}: no {lang} question in category {c}")

    for p in problems:
        print("FAIL", p)
    print(f"self-test: {len(questions)} questions ({n_zh} zh), {n_ex} with examples, "
          f"{n_cases} example answers: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 0 if not problems else 1


# ---------------------------------------------------------------- record

def record(qid, rc, out_path, err_path, seconds):
    """One answers line from an `edgellm ask --json` run: its exit status, stdout (the final
    message as one JSON object, with the answer in "text") and stderr (the reason when it
    failed). Anything unexpected becomes the line's error, never a crash: one broken answer
    must not stop the benchmark."""
    def read(p):
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError as e:
            return f"<{e}>"
    out, err = read(out_path), read(err_path).strip()
    line = {"id": qid, "answer": None, "error": None, "finish_reason": None, "seconds": float(seconds)}
    msg = None
    for text in reversed(out.strip().splitlines()):
        try:
            msg = json.loads(text)
            break
        except ValueError:
            continue
    if rc != "0" or not isinstance(msg, dict) or not isinstance(msg.get("text"), str):
        why = " / ".join(l.strip() for l in err.splitlines() if l.strip())[-400:] if err \
            else (out.strip()[:200] or "no output")
        if rc == "124":  # timeout(1): the ask itself hung past its own --timeout
            why = f"killed after {seconds} s: {why}"
        line["error"] = f"ask exit {rc}: {why}"
    else:
        line["answer"] = msg["text"]
        line["finish_reason"] = msg.get("finish_reason")
        line["usage"] = msg.get("usage")
    print(json.dumps(line, ensure_ascii=False))


# ---------------------------------------------------------------- report

def pct(right, asked):
    return f"{right:3d}/{asked:<3d} {100.0 * right / asked:5.1f} %" if asked else "  -"


def report(questions, answers_path, model, seconds, json_out):
    answers = {}
    with open(answers_path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                a = json.loads(line)
                answers[a["id"]] = a
    results = []
    for q in questions:
        a = answers.get(q["id"], {"answer": None, "error": "not asked"})
        right, why = judge(q, a.get("answer"))
        results.append({"id": q["id"], "category": q["category"], "lang": q["lang"],
                        "question": q["question"], "answer": a.get("answer"), "error": a.get("error"),
                        "finish_reason": a.get("finish_reason"), "seconds": a.get("seconds"),
                        "right": right, "why": a.get("error") or why, "accept": q["accept"],
                        "reject": q.get("reject", [])})

    def tally(key):
        t = OrderedDict()
        for r in results:
            k = t.setdefault(r[key], [0, 0])
            k[0] += r["right"]
            k[1] += 1
        return t

    total = [sum(r["right"] for r in results), len(results)]
    by_cat, by_lang = tally("category"), tally("lang")
    errors = sum(r["error"] is not None for r in results)
    print(f"== {model}")
    print(f"total      {pct(*total)}" + (f"   ({errors} without an answer)" if errors else "")
          + (f"   {seconds:.0f} s" if seconds is not None else ""))
    for name, t in (("category", by_cat), ("language", by_lang)):
        print(f"by {name}:")
        for k, (r, n) in t.items():
            print(f"  {k:<13}{pct(r, n)}")
    misses = [r for r in results if not r["right"]]
    print(f"misses ({len(misses)}):")
    for r in misses:
        print(f"  {r['id']} [{r['category']}/{r['lang']}] {r['question']}")
        if r["error"]:
            print(f"      error:    {r['error']}")
        else:
            print(f"      answer:   {json.dumps(r['answer'], ensure_ascii=False)}"
                  + (" (cut at max tokens)" if r["finish_reason"] == "length" else ""))
        print(f"      accepted: {' | '.join(r['accept'])}")
        if r["why"].startswith("reject"):
            print(f"      {r['why']}")
    if json_out:
        with open(json_out, "w", encoding="utf-8") as f:
            json.dump({"model": model, "seconds": seconds, "total": {"right": total[0], "asked": total[1]},
                       "by_category": {k: {"right": r, "asked": n} for k, (r, n) in by_cat.items()},
                       "by_lang": {k: {"right": r, "asked": n} for k, (r, n) in by_lang.items()},
                       "results": results}, f, ensure_ascii=False, indent=1)
            f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", default=DEFAULT_QUESTIONS, help="the question set (JSON lines)")
    ap.add_argument("--only", default="", help="comma-separated question ids (default: all)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--self-test", action="store_true")
    mode.add_argument("--list", action="store_true")
    mode.add_argument("--record", nargs=5, metavar=("ID", "RC", "OUT", "ERR", "SECONDS"))
    mode.add_argument("--answers", metavar="FILE", help="JSON lines: {id, answer, error, ...}")
    ap.add_argument("--model", default="model", help="the name printed in the report")
    ap.add_argument("--seconds", type=float, help="the run's wall time, for the report")
    ap.add_argument("--json-out", metavar="FILE", help="also write the result as JSON")
    a = ap.parse_args()
    if a.self_test:
        return self_test(a.questions)
    if a.record:
        record(*a.record)
        return 0
    questions = select(load_questions(a.questions), a.only)
    if a.list:
        for q in questions:
            print(f"{q['id']}\t{q['question']}")
        return 0
    report(questions, a.answers, a.model, a.seconds, a.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
