"""The rank of chosen edges in each method's ranking (by |score|) of a `headlab edges --method all` directory.

    python3 scripts/edge_method_ranks.py DIR L0H0->L1H0.k L0H0->L1H1.k

prints, per method (exact patching first), each edge's rank among all edges and its score, and the
smallest top-k that holds all the chosen edges."""
import json
import sys


def main(d, wanted):
    edges = json.load(open(f"{d}/edges.json"))["edges"]
    names = [e["sender"] + "->" + e["receiver"] for e in edges]
    for w in wanted:
        if w not in names:
            sys.exit(f"edge_method_ranks: no edge {w} in {d}/edges.json")
    scores = {"exact": [e["exact"] for e in edges]}
    scores.update({m["method"]: m["scores"] for m in json.load(open(f"{d}/comparison.json"))["methods"]})
    for method, s in scores.items():
        order = sorted(range(len(s)), key=lambda i: -abs(s[i]))
        rank = {names[i]: r + 1 for r, i in enumerate(order)}
        cells = "  ".join(f"{w} rank {rank[w]} ({s[names.index(w)]:+.4f})" for w in wanted)
        print(f"{method:13s} {cells}  all in its top {max(rank[w] for w in wanted)}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
