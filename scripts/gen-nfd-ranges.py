#!/usr/bin/env python3
"""Writes src/tokenizer/nfd_ranges.txt: for every codepoint whose NFD form starts with another
codepoint, that first codepoint, as runs START[-LAST]:NFD in hex (WordPiece's strip_accents
maps through it, then drops combining marks). From Python's own Unicode database, the source
llama.cpp's table (unicode_ranges_nfd) is made from too: with Python 3.11 (Unicode 14.0) the
two agree entry for entry, which keeps bert tokenization equal to llama.cpp's.

Usage: python3 scripts/gen-nfd-ranges.py > src/tokenizer/nfd_ranges.txt
"""
import unicodedata

runs = []
for c in range(0x110000):
    if 0xD800 <= c <= 0xDFFF:
        continue
    first = ord(unicodedata.normalize("NFD", chr(c))[0])
    if first == c:
        continue
    if runs and runs[-1][1] == c - 1 and runs[-1][2] == first:
        runs[-1][1] = c
    else:
        runs.append([c, c, first])

print(f"# Made by scripts/gen-nfd-ranges.py from Python's Unicode {unicodedata.unidata_version} database:")
print("# codepoint ranges and the first codepoint of their NFD form, as START[-LAST]:NFD in hex.")
print("# WordPiece's strip_accents maps each codepoint through it, then drops combining marks.")
line = []
for a, b, f in runs:
    line.append(f"{a:X}:{f:X}" if a == b else f"{a:X}-{b:X}:{f:X}")
    if len(line) == 12:
        print(" ".join(line))
        line = []
if line:
    print(" ".join(line))
