#!/usr/bin/env python3
"""Helpers of scripts/bench's peers part: inputs, the process-tree memory sampler, the LiteLLM
client, result checks and the Markdown table. Standard library only, except `litellm`, which
runs under the LiteLLM venv's python.

    bench.py inputs DIR N URL MODEL      write DIR/prompts/bench.yaml, DIR/bodies/*.json,
                                         DIR/prompts.jsonl, DIR/promptfoo/{config.yaml,tests.csv}
    bench.py rss PID OUT                 sample the RSS of PID's descendants until PID exits;
                                         write "peak_kib max_processes" to OUT
    bench.py litellm URL MODEL JSONL N   send every prompt through a LiteLLM Router, N in flight
    bench.py floor URL BODIES N          send every body over N keep-alive sockets, raw HTTP/1.1
    bench.py check TOOL OUT N            how many of N answers TOOL's output holds ("ok errors")
    bench.py table RESULTS.tsv IDEAL_S N the Markdown tables of the peers part (N prompts)
"""

import csv
import json
import os
import signal
import sys
import time
from pathlib import Path

# Request parameters every tool sends: temperature 0, one sample, a short answer.
MAX_TOKENS = 64

TOPICS = [
    "lighthouses", "tomatoes", "prime numbers", "the Rhine", "volcanoes", "sourdough",
    "binary search", "octopuses", "the Moon", "glaciers", "jazz", "bicycles", "copper",
    "honeybees", "chess openings", "the Roman calendar", "rainbows", "compilers", "tea",
    "the Sahara", "origami", "penguins", "magnets", "the printing press", "coral reefs",
]
TEMPLATES = [
    "Is {n} a prime number? Answer yes or no.",
    "What is {a} times {b}? Answer with the number only.",
    "Explain {t} to a ten-year-old in two sentences.",
    "Give three facts about {t} as a bulleted list.",
    "Write one sentence about {t} without using the letter z.",
    "Translate 'the {t} are beautiful today' into French.",
    "Summarise the history of {t} in one sentence.",
    "Return a JSON object with keys topic and difficulty for {t}. Output only JSON.",
]


def prompt_text(i):
    """The i-th prompt: deterministic, varied in kind and length."""
    template = TEMPLATES[i % len(TEMPLATES)]
    topic = TOPICS[(i * 7) % len(TOPICS)]
    return template.format(n=1000 + 37 * i, a=12 + i % 89, b=7 + (i * 13) % 97, t=topic)


def inputs(out, n, url, model):
    out = Path(out)
    prompts = [prompt_text(i) for i in range(n)]
    # canary's prompt set. JSON strings are YAML double-quoted scalars.
    (out / "prompts").mkdir(parents=True, exist_ok=True)
    with open(out / "prompts" / "bench.yaml", "w") as f:
        for i, p in enumerate(prompts):
            f.write(f"- id: bench-{i:04d}\n  prompt: {json.dumps(p)}\n")
            f.write(f"  params: {{ temperature: 0, max_tokens: {MAX_TOKENS} }}\n")
    # curl's request bodies, one file each.
    (out / "bodies").mkdir(exist_ok=True)
    for i, p in enumerate(prompts):
        body = {"model": model, "messages": [{"role": "user", "content": p}],
                "temperature": 0, "max_tokens": MAX_TOKENS}
        (out / "bodies" / f"{i:04d}.json").write_text(json.dumps(body))
    # LiteLLM's input.
    with open(out / "prompts.jsonl", "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
    # promptfoo: one prompt template filled from a tests CSV, one OpenAI provider on the lane.
    (out / "promptfoo").mkdir(exist_ok=True)
    with open(out / "promptfoo" / "tests.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["prompt"])
        for p in prompts:
            writer.writerow([p])
    (out / "promptfoo" / "config.yaml").write_text(
        f"""description: canary bench, {n} prompts
prompts:
  - "{{{{prompt}}}}"
providers:
  - id: openai:chat:{model}
    config:
      apiBaseUrl: {url}
      apiKey: bench-dummy-key
      temperature: 0
      max_tokens: {MAX_TOKENS}
tests: file://tests.csv
"""
    )


def descendants(root):
    """PIDs below root, through /proc/PID/task/TID/children."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            found.extend(kids)
            todo.extend(kids)
    return found


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, IndexError, ValueError):
        return 0


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X")


def rss(root, out):
    """Peak of the summed RSS of root's descendants (root is /usr/bin/time, left out), sampled
    every 50 ms: /usr/bin/time's own figure is the largest single process, not the tree."""
    root = int(root)
    peak = procs = 0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while alive(root) and not stop:
        pids = descendants(root)
        peak = max(peak, sum(rss_kib(p) for p in pids))
        procs = max(procs, len(pids))
        time.sleep(0.05)
    Path(out).write_text(f"{peak} {procs}\n")


def litellm_batch(url, model, jsonl, inflight):
    """The LiteLLM peer: a Router with one deployment on the lane, acompletion per prompt,
    an asyncio.Semaphore for the in-flight cap. Prints {"ok", "errors", "first_error"}."""
    # No download of the model cost map at import (the machine may have no network).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_TELEMETRY", "False")
    import asyncio

    import litellm
    from litellm import Router

    litellm.telemetry = False
    litellm.suppress_debug_info = True
    prompts = [json.loads(line)["prompt"] for line in open(jsonl)]
    router = Router(
        model_list=[{
            "model_name": "bench",
            "litellm_params": {"model": f"openai/{model}", "api_base": url,
                               "api_key": "bench-dummy-key"},
        }],
        num_retries=0,
        timeout=30,
    )

    async def main():
        semaphore = asyncio.Semaphore(int(inflight))
        ok, errors = 0, []

        async def one(prompt):
            nonlocal ok
            async with semaphore:
                try:
                    answer = await router.acompletion(
                        model="bench",
                        messages=[{"role": "user", "content": prompt}],
                        temperature=0,
                        max_tokens=MAX_TOKENS,
                    )
                    if answer.choices[0].message.content:
                        ok += 1
                    else:
                        errors.append("empty answer")
                except Exception as err:  # counted and reported, not raised
                    errors.append(repr(err)[:300])

        await asyncio.gather(*(one(p) for p in prompts))
        return ok, errors

    ok, errors = asyncio.run(main())
    json.dump({"ok": ok, "errors": len(errors), "first_error": errors[0] if errors else None},
              sys.stdout)
    print()


def floor(url, bodies, inflight):
    """The floor: what any client can get from the lane on this machine. N asyncio workers,
    each with one keep-alive connection, send the request bodies in raw HTTP/1.1 with no client
    library. Prints {"ok", "errors", "first_error"}."""
    import asyncio
    from urllib.parse import urlsplit

    target = urlsplit(url)
    path = target.path.rstrip("/") + "/chat/completions"
    queue = sorted(Path(bodies).glob("*.json"), reverse=True)

    async def worker():
        ok, errors = 0, []
        reader, writer = await asyncio.open_connection(target.hostname, target.port)
        while queue:
            body = queue.pop().read_bytes()
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: {target.netloc}\r\n"
                f"Content-Type: application/json\r\nAuthorization: Bearer bench-dummy-key\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body
            )
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            length = next(int(h.split(":", 1)[1]) for h in head if h.lower().startswith("content-length:"))
            answer = json.loads(await reader.readexactly(length))
            if head[0].split()[1] == "200" and answer["choices"][0]["message"]["content"]:
                ok += 1
            else:
                errors.append(head[0])
        writer.close()
        return ok, errors

    async def main():
        return await asyncio.gather(*(worker() for _ in range(int(inflight))))

    done = asyncio.run(main())
    errors = [e for _, errs in done for e in errs]
    json.dump({"ok": sum(ok for ok, _ in done), "errors": len(errors),
               "first_error": errors[0] if errors else None}, sys.stdout)
    print()


def check(tool, out, n):
    """Prints "ok errors detail" for a tool's saved output."""
    n = int(n)
    detail = ""
    try:
        text = Path(out).read_text(errors="replace")
        if tool == "canary":
            run = json.loads(text)
            counts = run["lanes"][0]["counts"]
            ok = counts.get("new", 0) + counts.get("unchanged", 0) + counts.get("within_noise", 0)
            errors = counts.get("failed", 0)
            detail = f"results {run.get('results')}, status {run.get('status')}"
        elif tool == "curl":
            codes = text.split()
            ok = codes.count("200")
            errors = len(codes) - ok
        elif tool == "promptfoo":
            stats = json.loads(text)["results"]["stats"]
            ok, errors = stats["successes"], stats["errors"] + stats["failures"]
        elif tool in ("litellm", "floor"):
            result = json.loads(text.strip().splitlines()[-1])
            ok, errors = result["ok"], result["errors"]
            detail = result.get("first_error") or ""
        else:
            raise ValueError(f"unknown tool {tool}")
    except (OSError, ValueError, KeyError, IndexError) as err:
        ok, errors, detail = 0, n, f"unreadable output: {err}"
    print(ok, errors, detail.replace("\t", " ").replace("\n", " ")[:200])


def fmt(value, digits=2):
    return f"{value:.{digits}f}"


# The targets are set for the full run; a smoke run's startup weighs too much to judge.
TARGET_PROMPTS = 1000


def table(results, ideal, n):
    """results: TSV rows tool, label, version, wall_s, busy_s, rss_mib, procs, ok, errors,
    served, max_in_flight, note (wall_s empty when the tool did not run)."""
    ideal = float(ideal)
    judged = int(n) >= TARGET_PROMPTS
    rows = []
    for line in Path(results).read_text().splitlines():
        f = line.split("\t")
        rows.append(dict(zip(
            ["tool", "label", "version", "wall", "busy", "rss", "procs", "ok", "errors",
             "served", "inflight", "note"], f)))
    out = []
    out.append("| tool | version | wall s | × ideal | lane busy s | peak RSS MiB | answers ok | "
               "lane served | max in flight |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if not r["wall"]:
            out.append(f"| {r['label']} | {r['version']} | – | – | – | – | – | – | – |")
            continue
        wall, rss = float(r["wall"]), float(r["rss"])
        procs = int(r["procs"] or 1)
        rss_text = fmt(rss, 1) + (f" ({procs} processes)" if procs > 1 else "")
        out.append(
            f"| {r['label']} | {r['version']} | {fmt(wall)} | {fmt(wall / ideal)} | "
            f"{fmt(float(r['busy']))} | {rss_text} | {r['ok']} | {r['served']} | "
            f"{r['inflight']} |"
        )
    notes = [f"- {r['label']}: {r['note']}" for r in rows if r.get("note")]
    if notes:
        out.append("")
        out.extend(notes)

    canary = next((r for r in rows if r["tool"] == "canary" and r["wall"]), None)
    if canary is None:
        out.append("")
        out.append("canary did not run: no ratios.")
        print("\n".join(out))
        return
    cw, cr = float(canary["wall"]), float(canary["rss"])
    out.append("")
    out.append("| canary against | canary faster by | canary's memory, fraction of the peer's | "
               "target (≥ 2× faster, ≤ 1/10 memory) |")
    out.append("|---|---:|---:|---|")
    for r in rows:
        if r["tool"] == "canary":
            continue
        if not r["wall"]:
            out.append(f"| {r['label']} | – | – | not run |")
            continue
        speed = float(r["wall"]) / cw
        fraction = cr / float(r["rss"]) if float(r["rss"]) else float("inf")
        if r["tool"] in ("curl", "floor"):
            verdict = "reference, no target"
        elif not judged:
            verdict = f"not judged below {TARGET_PROMPTS} prompts"
        else:
            verdict = ", ".join([
                ("faster: met" if speed >= 2 else "faster: **missed**"),
                ("memory: met" if fraction <= 0.1 else "memory: **missed**"),
            ])
        share = f"1/{fmt(1 / fraction, 1 if fraction > 0.1 else 0)}" if fraction else "–"
        out.append(f"| {r['label']} | {fmt(speed)}× | {fmt(fraction, 3)} ({share}) | {verdict} |")
    ratio = cw / ideal
    out.append("")
    if not judged:
        verdict = f"not judged below {TARGET_PROMPTS} prompts (startup weighs more in a short run)."
    else:
        verdict = "met." if ratio <= 1.10 else "**missed**."
    out.append(f"canary within 1.10× of ideal: {fmt(ratio)}× — {verdict}")
    floor_row = next((r for r in rows if r["tool"] == "floor" and r["wall"]), None)
    if floor_row:
        fb, cb = float(floor_row["busy"]), float(canary["busy"])
        out.append(
            f"Against the floor: the lane was busy {fmt(cb)} s with canary and {fmt(fb)} s with "
            f"the raw client ({fmt(cb / fb)}×), so the lane itself on this machine takes "
            f"{fmt(fb / ideal)}× the ideal; canary's {fmt(cw - cb)} s outside that is its "
            f"startup, judging and output."
        )
    print("\n".join(out))


def main(argv):
    commands = {
        "inputs": (inputs, 4, lambda a: (a[0], int(a[1]), a[2], a[3])),
        "rss": (rss, 2, tuple),
        "litellm": (litellm_batch, 4, tuple),
        "floor": (floor, 3, tuple),
        "check": (check, 3, tuple),
        "table": (table, 3, tuple),
    }
    if not argv or argv[0] not in commands or len(argv) - 1 != commands[argv[0]][1]:
        sys.exit(__doc__)
    function, _, convert = commands[argv[0]]
    function(*convert(argv[1:]))


if __name__ == "__main__":
    main(sys.argv[1:])
