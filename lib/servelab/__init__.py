"""servelab: the reference library of the servelab course on LLM inference serving.

Every notebook of the course imports from here, so what a chapter shows is what this code computes.
One package per chapter, named for its concept; the book's architecture page renders this table, and
a test holds it to the packages that exist and to what each chapter's notebook imports.

Chapters:

  §0  lifecycle      the request state machine: states, guards, one reclaim, the ledger
  §1  server         HTTP to token stream: the OpenAI-compatible server, gate, bridge, cold start
  §2  metrics        latency metrics and goodput, the roofline, capacity arithmetic, simulated load
  §3  sampling       logits to a token: sampling stages, stop strings, constrained and grammar masks
  §4  kv             the KV cache: bytes, blocks, the allocator, prefix caching, eviction
  §5  scheduling     batching, queue order and the queueing disciplines, as tick simulations
  §6  cluster        replicas and routing, parallelism, disaggregation, multi-LoRA adapters
  §7  optimizations  speculative decoding, quantization, the cost of a decode step
  §8  engine         the decoding engine that strings §3-§5 into one step
  §9  questions      the interview-question bank and the design exercise
  §A  checks         the sanity checks, one line each, a module: python -m servelab.checks

Beside the chapters: ``model`` (the course's tiny Llama, its tokenizer and checkpoints), ``viz``
(one function per figure), ``loadgen`` (a load generator for any OpenAI-compatible endpoint),
``bench`` (the engine measured from outside) and ``exercises`` (the exercise notebooks' checkers);
and three plain
modules, ``device`` (the one device rule), ``prose`` (data written as words) and ``_validate``
(argument checks).
"""

__version__ = "0.1.0"
