#!/usr/bin/env python3
"""Build the tiny model's training corpus and held-out slice, deterministically.

Sources (Debian packages; install with `apt-get install bible-kjv bible-kjv-text fortunes dict-gcide`):
  * King James Bible (public domain), printed chapter by chapter by the `bible` program;
  * fortune cookies from /usr/share/games/fortunes (package `fortunes`);
  * GCIDE dictionary entries from /usr/share/dictd/gcide.dict.dz (package `dict-gcide`);
  * a synthetic chat / tool-call slice rendered in V4's chat encoding (v4chat.py), built from
    the three sources above plus arithmetic, with a fixed random seed.

Every document starts with the BOS string.  The held-out split is chosen by a stable hash of
each document's key, so rebuilding gives byte-identical output.

Writes OUT/train.jsonl, OUT/eval.jsonl ({"src", "text"} per line) and OUT/heldout.txt (the eval
documents concatenated: the file the perplexity numbers are computed on).
"""
import argparse
import gzip
import hashlib
import json
import os
import random
import re
import subprocess

import v4chat

FORTUNE_DIR = "/usr/share/games/fortunes"
GCIDE_DICT = "/usr/share/dictd/gcide.dict.dz"
GCIDE_INDEX = "/usr/share/dictd/gcide.index"


def bucket(key):
    """Stable 0..9999 bucket for a document key (the held-out selector)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 10000


def kjv_chapters():
    text = subprocess.run(["bible", "-l100000", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                          text=True).stdout
    chapters, cur = [], None
    for line in text.split("\n"):
        m = re.match(r"^(\S.*) (\d+)$", line)
        if m:
            cur = (m.group(1), int(m.group(2)), [])
            chapters.append(cur)
            continue
        m = re.match(r"^\s+(\d+) (.*)$", line)
        if m and cur is not None:
            cur[2].append((int(m.group(1)), m.group(2).strip()))
    return chapters


def fortunes():
    out = []
    for name in sorted(os.listdir(FORTUNE_DIR)):
        path = os.path.join(FORTUNE_DIR, name)
        if "." in name or not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            body = f.read()
        for i, entry in enumerate(re.split(r"\n%\n", body)):
            entry = entry.strip("\n%").rstrip()
            if entry.strip():
                out.append((f"{name}/{i}", entry))
    return out


def gcide_entries():
    """(headword, cleaned entry text) in dictionary order, one per distinct entry body."""
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def dec(s):
        v = 0
        for ch in s:
            v = v * 64 + b64.index(ch)
        return v

    with gzip.open(GCIDE_DICT, "rb") as f:
        data = f.read()
    seen, out = set(), []
    with open(GCIDE_INDEX, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3 or parts[0].startswith("00-database"):
                continue
            off, ln = dec(parts[1]), dec(parts[2])
            if off in seen:
                continue
            seen.add(off)
            raw = data[off:off + ln].decode("utf-8", errors="replace")
            text = clean_gcide(raw)
            if len(text) > 20:
                out.append((off, parts[0], text))
    out.sort()
    return [(h, t) for _, h, t in out]


def clean_gcide(raw):
    lines = []
    for line in raw.strip("\n").split("\n"):
        if re.match(r"^\s*\[[^\]]*(Webster|PJC|WordNet|Suppl)[^\]]*\]\s*$", line):
            continue
        line = re.sub(r"\\[^\\\n]*\\", "", line)   # drop pronunciation marks like \Ab*do"men\
        line = line.replace("{", "").replace("}", "")
        line = re.sub(r"(\S) +,", r"\1,", line)
        lines.append(line.rstrip())
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def first_sense(entry):
    """A one-sentence gloss from a cleaned GCIDE entry, or None."""
    body = " ".join(l.strip() for l in entry.split("\n")[1:] if l.strip())
    body = re.sub(r"^\d+\.\s*", "", body)
    body = re.sub(r"^\([^)]*\)\s*", "", body)
    m = re.match(r"([A-Z][^.;]{10,160}[.;])", body)
    if not m:
        return None
    return m.group(1).rstrip(";") .rstrip(".") + "."


CITIES = ["Paris", "London", "Tokyo", "Cairo", "Lima", "Oslo", "Rome", "Delhi", "Sydney", "Boston",
          "Madrid", "Berlin", "Nairobi", "Toronto", "Seoul", "Dublin", "Vienna", "Athens", "Prague", "Quito"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "clear", "stormy"]
GREETINGS = [
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi there.", "Hi! What would you like to talk about?"),
    ("Good morning.", "Good morning! How can I help?"),
    ("Who are you?", "I am a small language model. I can answer simple questions, quote the Bible, define words and call tools."),
    ("Thank you.", "You are welcome."),
    ("Thanks for the help!", "Glad I could help."),
    ("What can you do?", "I can quote verses of the King James Bible, define English words, do simple sums and call tools such as a weather service."),
    ("Tell me a joke.", "Why did the scarecrow win an award? Because he was outstanding in his field."),
    ("How are you?", "I am doing well, thank you. How can I help you?"),
    ("Goodbye.", "Goodbye! Have a nice day."),
]
TOOLS = [
    {"name": "get_weather", "description": "Get the current weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"]}},
    {"name": "lookup_verse", "description": "Look up a verse of the King James Bible.",
     "parameters": {"type": "object", "properties": {"book": {"type": "string"}, "chapter": {"type": "integer"},
                                                     "verse": {"type": "integer"}},
                    "required": ["book", "chapter", "verse"]}},
    {"name": "define_word", "description": "Look up an English word in the dictionary.",
     "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}},
    {"name": "add", "description": "Add two integers.",
     "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"]}},
]
SYSTEMS = ["You are a helpful assistant.", "You are a concise assistant.", "",
           "You are a helpful assistant. Answer briefly."]


def chat_docs(rng, verses, glosses, n):
    """n synthetic conversations, each (key, rendered text)."""
    docs = []
    for k in range(n):
        kind = rng.random()
        sys_text = rng.choice(SYSTEMS)
        msgs = [{"role": "system", "content": sys_text}] if sys_text else []
        thinking = False
        if kind < 0.22:                                        # verse quotation
            book, c, v, text = rng.choice(verses)
            q = rng.choice([f"What does {book} {c}:{v} say?", f"Quote {book} {c}:{v}.",
                            f"Can you recite {book} chapter {c}, verse {v}?"])
            msgs += [{"role": "user", "content": q},
                     {"role": "assistant", "content": f"{book} {c}:{v} says: \"{text}\""}]
        elif kind < 0.44:                                      # definition
            word, gloss = rng.choice(glosses)
            q = rng.choice([f"What does the word \"{word}\" mean?", f"Define {word}.",
                            f"What is the meaning of {word}?"])
            msgs += [{"role": "user", "content": q},
                     {"role": "assistant", "content": f"{word}: {gloss}"}]
        elif kind < 0.56:                                      # arithmetic, sometimes thinking mode
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            msgs += [{"role": "user", "content": rng.choice([f"What is {a} plus {b}?", f"Add {a} and {b}."])}]
            if rng.random() < 0.5:
                thinking = True
                msgs.append({"role": "assistant", "reasoning": f"The user wants {a} + {b}. {a} + {b} = {a + b}.",
                             "content": f"{a} plus {b} is {a + b}."})
            else:
                msgs.append({"role": "assistant", "content": f"{a} plus {b} is {a + b}."})
        elif kind < 0.66:                                      # small talk, sometimes thinking mode
            q, a = rng.choice(GREETINGS)
            msgs.append({"role": "user", "content": q})
            if rng.random() < 0.4:
                thinking = True
                msgs.append({"role": "assistant", "reasoning": "A short friendly reply is enough.", "content": a})
            else:
                msgs.append({"role": "assistant", "content": a})
        else:                                                  # tool call round trip
            tools = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
            tool = rng.choice(tools)
            msgs = [{"role": "system", "content": sys_text or "You are a helpful assistant.", "tools": tools}]
            if tool["name"] == "get_weather":
                city, cond, temp = rng.choice(CITIES), rng.choice(CONDITIONS), rng.randint(-10, 35)
                args = {"city": city}
                if rng.random() < 0.3:
                    args["unit"] = "celsius"
                q = rng.choice([f"What is the weather in {city}?", f"Is it cold in {city} today?",
                                f"How is the weather in {city} right now?"])
                result = json.dumps({"city": city, "temperature": temp, "condition": cond})
                answer = f"It is {temp} degrees and {cond} in {city}."
            elif tool["name"] == "lookup_verse":
                book, c, v, text = rng.choice(verses)
                args = {"book": book, "chapter": c, "verse": v}
                q = f"Please look up {book} {c}:{v} for me."
                result = json.dumps({"reference": f"{book} {c}:{v}", "text": text})
                answer = f"{book} {c}:{v} reads: \"{text}\""
            elif tool["name"] == "define_word":
                word, gloss = rng.choice(glosses)
                args = {"word": word}
                q = rng.choice([f"Look up the word {word} in the dictionary.", f"Use the dictionary to define {word}."])
                result = json.dumps({"word": word, "definition": gloss})
                answer = f"The dictionary says that {word} means: {gloss}"
            else:
                a, b = rng.randint(0, 999), rng.randint(0, 999)
                args = {"a": a, "b": b}
                q = f"Use the calculator to add {a} and {b}."
                result = json.dumps({"result": a + b})
                answer = f"The sum of {a} and {b} is {a + b}."
            pre = rng.choice(["", "", "Let me check that.", "I will use a tool for this."])
            msgs += [{"role": "user", "content": q},
                     {"role": "assistant", "content": pre, "tool_calls": [(tool["name"], args)]},
                     {"role": "tool", "content": result},
                     {"role": "assistant", "content": answer}]
        docs.append((f"chat/{k}", v4chat.render(msgs, thinking=thinking)))
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--chats", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    B = v4chat.BOS
    docs = []   # (src, key, text, eval_permille_x10)

    chapters = kjv_chapters()
    verses = []
    for book, c, vs in chapters:
        body = f"{book} {c}\n\n" + "\n".join(f"{n} {t}" for n, t in vs) + "\n"
        docs.append(("kjv", f"kjv/{book}/{c}", B + body, 200))
        if bucket(f"kjv/{book}/{c}") >= 200:       # chat slice only quotes training chapters
            verses += [(book, c, n, t) for n, t in vs if len(t) < 200]
    for key, text in fortunes():
        docs.append(("fortunes", f"fortune/{key}", B + text + "\n", 200))
    entries = gcide_entries()
    glosses = []
    for i in range(0, len(entries), 16):          # 16 consecutive entries per document
        group = entries[i:i + 16]
        key = f"gcide/{i}"
        docs.append(("gcide", key, B + "\n\n".join(t for _, t in group) + "\n", 100))
        if bucket(key) >= 100:
            for head, text in group:
                g = first_sense(text)
                if g and re.fullmatch(r"[A-Za-z][a-z-]{2,20}", head):
                    glosses.append((head.lower(), g))
    rng = random.Random(args.seed)
    for key, text in chat_docs(rng, verses, glosses, args.chats):
        docs.append(("chat", key, text, 200))

    counts = {}
    with open(os.path.join(args.out, "train.jsonl"), "w", encoding="utf-8") as tr, \
         open(os.path.join(args.out, "eval.jsonl"), "w", encoding="utf-8") as ev, \
         open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8") as ho:
        for src, key, text, held in docs:
            is_eval = bucket(key) < held
            rec = json.dumps({"src": src, "text": text}, ensure_ascii=False)
            (ev if is_eval else tr).write(rec + "\n")
            if is_eval:
                ho.write(text)
            c = counts.setdefault(src, [0, 0, 0, 0])
            c[2 * is_eval] += 1
            c[2 * is_eval + 1] += len(text.encode())
    for src, (nt, bt, ne, be) in counts.items():
        print(f"{src:9s} train {nt:6d} docs {bt / 1e6:7.2f} MB   eval {ne:5d} docs {be / 1e3:7.1f} KB")


if __name__ == "__main__":
    main()
