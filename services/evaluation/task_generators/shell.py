"""``shell``: file and text work in /app (count, sort, cut, sum, rename…), one of ten templates
per task, in order, with random inputs. Verifiers check the files the agent leaves in /app."""

from __future__ import annotations

import random
from collections.abc import Callable

from services.evaluation.task_generators.rendering import TaskSpec, answer_check, lines_check, q

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
         "mallory", "nina", "oscar", "peggy", "rupert", "sybil", "trent", "victor", "walter"]
FRUITS = ["apple", "banana", "cherry", "grape", "kiwi", "lemon", "mango", "melon", "olive",
          "peach", "pear", "plum"]
CITIES = ["austin", "berlin", "cairo", "delhi", "lima", "lisbon", "madrid", "oslo", "paris",
          "quito", "rome", "seoul", "tokyo", "vienna"]
TEAMS = ["red", "blue", "green", "gold", "teal"]
# No word here is a substring of another, so a plain sed replacement is also a whole-word one.
WORDS = ["river", "stone", "cloud", "tiger", "maple", "frost", "ember", "lotus", "orbit",
         "quill", "pixel", "sand", "wolf", "harbor", "bright", "moss"]
NEW_WORDS = ["comet", "falcon", "glacier", "meadow", "nebula", "willow", "zephyr"]
LEVELS = ["INFO", "WARN", "ERROR", "DEBUG"]
MESSAGES = ["cache miss for key", "request served", "retrying upstream call",
            "disk usage checked", "user logged in", "connection reset by peer",
            "job finished", "config reloaded", "slow query detected", "token refreshed"]
FOLDERS = ["notes", "out", "docs", "reports", "drafts"]

ANSWER_NOTE = "Write only the answer (nothing else) to /app/answer.txt."


def t_count_level(rng: random.Random) -> TaskSpec:
    level = rng.choice(["ERROR", "WARN"])
    rows: list[str] = []
    for i in range(rng.randint(12, 30)):
        month, day, hour, minute = (rng.randint(1, 12), rng.randint(1, 28),
                                    rng.randint(0, 23), rng.randint(0, 59))
        stamp = f"2024-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{i % 60:02d}"
        rows.append(f"{stamp} {rng.choice(LEVELS)} {rng.choice(MESSAGES)} {rng.randint(1, 999)}")
    rows[rng.randrange(len(rows))] = rows[0].split(" ", 1)[0] + f" {level} {rng.choice(MESSAGES)} 1"
    count = sum(1 for r in rows if r.split(" ")[1] == level)
    return TaskSpec(
        instruction=(
            f"Each line of /app/app.log is `TIMESTAMP LEVEL MESSAGE`. How many lines have the "
            f"level {level}? {ANSWER_NOTE}\n"
        ),
        app={"app.log": "\n".join(rows) + "\n"},
        check=answer_check(str(count)),
        solve=f"awk '$2 == \"{level}\"' /app/app.log | wc -l > /app/answer.txt\n",
        summary=f"{count} {level} lines",
        metadata={"kind": "shell", "template": "count_level"},
    )


def t_count_word(rng: random.Random) -> TaskSpec:
    vocab = rng.sample(WORDS, 8)
    target = vocab[0]
    text_lines = [" ".join(rng.choice(vocab) for _ in range(rng.randint(4, 9)))
                  for _ in range(rng.randint(6, 14))]
    text_lines[rng.randrange(len(text_lines))] += f" {target}"
    count = sum(line.split().count(target) for line in text_lines)
    return TaskSpec(
        instruction=(
            f"How many times does the word `{target}` occur in /app/text.txt? Words are "
            f"separated by single spaces. {ANSWER_NOTE}\n"
        ),
        app={"text.txt": "\n".join(text_lines) + "\n"},
        check=answer_check(str(count)),
        solve=f"grep -ow {q(target)} /app/text.txt | wc -l > /app/answer.txt\n",
        summary=f"{target} occurs {count} times",
        metadata={"kind": "shell", "template": "count_word"},
    )


def t_sort_unique(rng: random.Random) -> TaskSpec:
    pool = rng.sample(NAMES, rng.randint(5, 9))
    rows = pool + [rng.choice(pool) for _ in range(rng.randint(5, 14))]
    rng.shuffle(rows)
    expected = sorted(set(rows))
    return TaskSpec(
        instruction=(
            "Write the distinct lines of /app/names.txt to /app/sorted.txt, sorted "
            "alphabetically, one per line, each line appearing once.\n"
        ),
        app={"names.txt": "\n".join(rows) + "\n"},
        check=lines_check("/app/sorted.txt", expected),
        solve="sort -u /app/names.txt > /app/sorted.txt\n",
        summary=f"{len(expected)} distinct names",
        metadata={"kind": "shell", "template": "sort_unique"},
    )


def t_most_common(rng: random.Random) -> TaskSpec:
    pool = rng.sample(FRUITS, rng.randint(4, 7))
    counts = {fruit: rng.randint(1, 5) for fruit in pool}
    winner = pool[0]
    counts[winner] = max(counts.values()) + rng.randint(1, 2)
    rows = [fruit for fruit, c in counts.items() for _ in range(c)]
    rng.shuffle(rows)
    return TaskSpec(
        instruction=(
            "/app/items.txt lists one fruit per line. Which fruit appears most often? "
            f"{ANSWER_NOTE}\n"
        ),
        app={"items.txt": "\n".join(rows) + "\n"},
        check=answer_check(winner),
        solve=(
            "sort /app/items.txt | uniq -c | sort -rn | head -n 1 | awk '{print $2}' "
            "> /app/answer.txt\n"
        ),
        summary=f"{winner} x{counts[winner]}",
        metadata={"kind": "shell", "template": "most_common"},
    )


def _people_csv(rng: random.Random) -> tuple[list[str], list[dict[str, str]]]:
    header = ["name", "age", "city", "team"]
    rng.shuffle(header)
    people = [
        {"name": name, "age": str(rng.randint(18, 80)), "city": rng.choice(CITIES),
         "team": rng.choice(TEAMS)}
        for name in rng.sample(NAMES, rng.randint(5, 10))
    ]
    return header, people


def t_extract_column(rng: random.Random) -> TaskSpec:
    header, people = _people_csv(rng)
    column = rng.choice(["name", "city", "team"])
    csv = [",".join(header)] + [",".join(p[h] for h in header) for p in people]
    expected = [p[column] for p in people]
    return TaskSpec(
        instruction=(
            f"/app/people.csv is a comma-separated file with a header row. Write the values of "
            f"its `{column}` column to /app/column.txt, one per line, in the original order, "
            "without the header.\n"
        ),
        app={"people.csv": "\n".join(csv) + "\n"},
        check=lines_check("/app/column.txt", expected),
        solve=f"tail -n +2 /app/people.csv | cut -d, -f{header.index(column) + 1} > /app/column.txt\n",
        summary=f"column {column}",
        metadata={"kind": "shell", "template": "extract_column"},
    )


def t_sum_column(rng: random.Random) -> TaskSpec:
    header = ["item", "qty", "price"]
    column = rng.choice(["qty", "price"])
    rows = [(fruit, rng.randint(1, 40), rng.randint(1, 500))
            for fruit in rng.sample(FRUITS, rng.randint(4, 9))]
    csv = [",".join(header)] + [f"{item},{qty},{price}" for item, qty, price in rows]
    total = sum(qty if column == "qty" else price for _, qty, price in rows)
    index = header.index(column) + 1
    return TaskSpec(
        instruction=(
            f"/app/sales.csv is a comma-separated file with a header row. What is the sum of its "
            f"`{column}` column? {ANSWER_NOTE}\n"
        ),
        app={"sales.csv": "\n".join(csv) + "\n"},
        check=answer_check(str(total)),
        solve=f"awk -F, 'NR > 1 {{ s += ${index} }} END {{ print s }}' /app/sales.csv > /app/answer.txt\n",
        summary=f"sum of {column} = {total}",
        metadata={"kind": "shell", "template": "sum_column"},
    )


def t_create_file(rng: random.Random) -> TaskSpec:
    path = f"/app/{rng.choice(FOLDERS)}/{rng.choice(NAMES)}.txt"
    content = [f"{rng.choice(WORDS)}={rng.randint(0, 999)}" for _ in range(rng.randint(2, 4))]
    block = "\n".join(content)
    return TaskSpec(
        instruction=(
            f"Create the file {path} (and its directory) containing exactly these "
            f"{len(content)} lines:\n\n```\n{block}\n```\n"
        ),
        check=lines_check(path, content),
        solve=(f"mkdir -p {path.rsplit('/', 1)[0]}\n"
               f"printf '%s\\n' {' '.join(q(c) for c in content)} > {path}\n"),
        summary=f"create {path}",
        metadata={"kind": "shell", "template": "create_file"},
    )


def t_rename_ext(rng: random.Random) -> TaskSpec:
    stems = rng.sample(WORDS, rng.randint(5, 7))
    n_txt = len(stems) - 2
    contents = {stem: f"{stem} {rng.randint(100, 999)}" for stem in stems}
    app = {f"data/{s}.txt": contents[s] + "\n" for s in stems[:n_txt]}
    others = {f"data/{s}.{ext}": contents[s] + "\n"
              for s, ext in zip(stems[n_txt:], rng.sample(["csv", "log", "md.bak"], 2), strict=True)}
    app.update(others)
    check = "reward=1\n"
    for stem in stems[:n_txt]:
        check += f'[ ! -e /app/data/{stem}.txt ] || reward=0\n'
        check += f'[ "$(trimmed /app/data/{stem}.md)" = {q(contents[stem])} ] || reward=0\n'
    for rel, text in others.items():
        check += f'[ "$(trimmed /app/{rel})" = {q(text.strip())} ] || reward=0\n'
    return TaskSpec(
        instruction=(
            "Rename every file in /app/data whose name ends in `.txt` so that it ends in `.md` "
            "instead, keeping the rest of the name and the contents. Leave other files as they are.\n"
        ),
        app=dict(sorted(app.items())),
        check=check,
        solve='for f in /app/data/*.txt; do mv -- "$f" "${f%.txt}.md"; done\n',
        summary=f"rename {n_txt} .txt files",
        metadata={"kind": "shell", "template": "rename_ext"},
    )


def t_replace_word(rng: random.Random) -> TaskSpec:
    vocab = rng.sample(WORDS, 6)
    old, new = vocab[0], rng.choice(NEW_WORDS)
    rows = [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 7)))
            for _ in range(rng.randint(4, 9))]
    rows[rng.randrange(len(rows))] += f" {old}"
    expected = [" ".join(new if w == old else w for w in row.split()) for row in rows]
    return TaskSpec(
        instruction=(
            f"Edit /app/message.txt in place: replace every occurrence of the word `{old}` "
            f"with `{new}`. Change nothing else.\n"
        ),
        app={"message.txt": "\n".join(rows) + "\n"},
        check=lines_check("/app/message.txt", expected),
        solve=f"sed -i 's/{old}/{new}/g' /app/message.txt\n",
        summary=f"{old} -> {new}",
        metadata={"kind": "shell", "template": "replace_word"},
    )


def t_extreme_number(rng: random.Random) -> TaskSpec:
    numbers = rng.sample(range(1, 10000), rng.randint(10, 25))
    largest = rng.random() < 0.5
    answer = max(numbers) if largest else min(numbers)
    word, tail = ("largest", "tail") if largest else ("smallest", "head")
    return TaskSpec(
        instruction=f"What is the {word} number in /app/numbers.txt (one integer per line)? {ANSWER_NOTE}\n",
        app={"numbers.txt": "\n".join(map(str, numbers)) + "\n"},
        check=answer_check(str(answer)),
        solve=f"sort -n /app/numbers.txt | {tail} -n 1 > /app/answer.txt\n",
        summary=f"{word} = {answer}",
        metadata={"kind": "shell", "template": "extreme_number"},
    )


TEMPLATES: list[Callable[[random.Random], TaskSpec]] = [
    t_count_level, t_count_word, t_sort_unique, t_most_common, t_extract_column,
    t_sum_column, t_create_file, t_rename_ext, t_replace_word, t_extreme_number,
]


def public_tasks(rng: random.Random, n: int) -> list[TaskSpec]:
    """The repository's draw: ``n`` tasks, the templates in turn."""
    return [draw(rng, index) for index in range(n)]


def draw(rng: random.Random, index: int) -> TaskSpec:
    """The ``index``-th task of a split: template ``index`` mod 10, so every split has them in equal shares."""
    return TEMPLATES[index % len(TEMPLATES)](rng)
