"""`dcoco demo --small / --full / --smoke`: the paper's experiment rebuilt at small scale on the embedded
SmolLM2-135M-Instruct target, offline, CPU or GPU (`dcoco demo` alone evaluates the shipped drafters: shipped.py).

1. corpus: the target's own greedy responses shipped as token ids (data/smollm2-corpus.npz, made by
   scripts/make_demo_corpus.py); one teacher-forced target pass computes features and labels here.
2. DFlash: a drafter trained alone, `steps` steps of the DFlash loss over a shortlist (LOSS_VOCAB), then
   `long_steps` more over the whole LM head (dflash-long: the DFlash baseline).
3. corrector and dflash2: on the frozen dflash-long drafter, one contract (frozen.py): the drafter's outputs are
   cached once over the corpus, then DCOCO's corrector (L_corr) and DFlash2's candidate selector (selector.py,
   the baseline corrector) train on them with the same steps, batch and optimizer.
4. DCOCO joint, the schedule recipes/qwen3-8b-zlab.toml runs: the dflash-long drafter and the frozen-trained
   corrector trained on together for `joint_steps` steps at JOINT_LR, L_corr's gradient into the drafter weighted
   by JOINT_CORR_GRAD (dcoco-drafter). Its control, `online`: the same stage with that weight 0, so the drafter
   is not co-trained (it is dflash-long trained on alone for as many steps: DFlash with the joint drafter's
   budget) and the corrector keeps learning online. HEADLINE names the DCOCO the demo answers with.
   The paper's baselines get the same budget on their published recipes (domino-recipe, dspark-recipe): the
   dflash-long drafter and the frozen-trained head, trained together on the head's own objective (Domino's
   curriculum, DSpark's CE + L1 + confidence loss) for joint_steps steps at JOINT_LR.
5. eval: prompts from rows of the paper's suites (shipped in data/suites) that no training prompt came from.
   tau, its ratios over DFlash with paired 95% bootstrap CIs, the oracles and teacher-forced coverage come from
   greedy decoding simulated exactly (simulate.py: one target pass per prompt, every method on sim_rows prompts
   per suite); tokens/s, speedup and the greedy losslessness check from real decoding of a few of them,
   target-only and by every method in turn (same machine state).

With a given drafter (run's drafter, `dcoco demo --drafter`), that checkpoint replaces step 2's stages and the
rest is built on it.

Every stage is cached under $DCOCO_CACHE (~/.cache/dcoco): the corpus under corpus/, the trained checkpoints
(serving layout) under demo-SIZE/; an interrupted run resumes and a second run only evaluates. The JSON's headline
keys, the printed table and the plots: report.py."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import random
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..modeling import checkpoint
from ..target import corpus, smollm2
from ..train import frozen, stages
from ..specdec import simulate
from ..corrector import Corrector
from ..modeling.domino import DominoHead
from ..modeling.dspark import DSparkHead
from ..modeling.selector import CandidateSelector
from ..modeling.dflash import DFlashDrafter
from ..suites import default_suites, load_suites
from ..target.load import SMOLLM2, load_target
from ..train.recipe import SMOLLM2_TAPS, cache_dir, drafter_config
from ..specdec.evaluate import decode_all, encode
from ..specdec.engine import Engine, summarize
from ..specdec.stats import tau_table
from ..train.training import TrainConfig, train
from . import release, report
from .report import ANCHOR, BUDGET_CONTROL, DFLASH2, DOMINO, DOMINO_RECIPE, DSPARK, DSPARK_RECIPE, FROZEN, JOINT_OFF
from .report import ONLINE, RATIO_BASES
from ..train.prompts import EVAL_ROWS_RESERVED  # the demo evaluates rows below it; training never sees them
# training rows per suite of the shipped suites (data/suites; index >= EVAL_ROWS_RESERVED, shuffled with seed 0); aime25
# (30 rows) is evaluation only, livecodebench prompts are mostly longer than the 300-token cap
TRAIN_ROWS = {"gsm8k": 250, "math500": 150, "mbpp": 120, "humaneval": 80, "arena-hard-v2": 120, "mt-bench": 40,
              "livecodebench": 1000}
CORPUS_FILE = "smollm2-corpus.npz"
# the drafter's depth and block size; bench/results/levers/README.md measures other depths and blocks
LAYERS, BLOCK = 3, 8
# the frozen-drafter correctors (DCOCO's and DFlash2's selector): blocks cached per sequence, blocks per step (the
# small and full sizes'), the selector's codebook rank
FROZEN_ANCHORS, FROZEN_BATCH, SELECTOR_RANK = 64, 256, 32
# the joint stage (step 4): L_corr's gradient weight into the drafter (1: the paper's sum) and its peak lr, half
# the first stages' like the Qwen3-8B recipe's; bench/joint_study.py compares the choices
JOINT_CORR_GRAD, JOINT_LR = 1.0, 3e-4
HEADLINE = "joint"  # the DCOCO the headline reports: "joint" (co-adapted) or "frozen" (frozen-drafter corrector)
# the first DFlash stage's loss: over the corpus's 4,096 most frequent response tokens plus each batch's labels, a
# cheaper step than one over all 49,152 rows, so the stage takes more steps in the same CPU time and its drafter
# ends stronger (bench/levers.py; the figures are in bench/results/levers/README.md). The later stages (the DFlash
# baseline's and DCOCO's joint steps) keep the whole head, so both see the same loss.
LOSS_VOCAB = 4096


@dataclasses.dataclass(frozen=True)
class Size:
    sequences: int | None  # corpus sequences (None: all)
    steps: int             # DFlash drafter steps from scratch, over the shortlist
    long_steps: int        # then DFlash steps over the whole head: the baseline drafter
    corrector_steps: int   # the corrector (and the selector) on the frozen baseline drafter
    joint_steps: int       # then the baseline drafter and that corrector trained jointly (and the online control)
    suites: tuple[str, ...]
    rows: int              # evaluated prompts per suite
    max_new_tokens: int
    rules: tuple[str, ...]  # DCOCO path rules evaluated
    sim_rows: int           # prompts per suite in the simulated evaluation (tau and its CIs; simulate.py)
    sim_tokens: int         # their max new tokens
    # per-step work: anchors per sequence in the drafter and joint stages (None: TrainConfig's default), and the
    # frozen-drafter stages' cached blocks per sequence and blocks per step
    anchors: int | None = None
    frozen_anchors: int = FROZEN_ANCHORS
    frozen_batch: int = FROZEN_BATCH
    cost_repeats: int = 200  # timed selections per method for the per-round cost

    def __post_init__(self):
        assert max(self.rows, self.sim_rows) <= EVAL_ROWS_RESERVED, "evaluated rows must stay clear of training"


ALL_SUITES = ("gsm8k", "math500", "aime25", "humaneval", "mbpp", "livecodebench", "mt-bench", "arena-hard-v2")
SIZES = {  # rows / max_new_tokens: real decoding (tokens/s, losslessness); sim_*: the simulated tau with CIs
    # every stage and every report with the least work per step: a pipeline check, not an experiment
    "smoke": Size(8, 3, 2, 2, 2, ("gsm8k", "mbpp"), 1, 12, ("greedy",), 3, 16, anchors=4, frozen_anchors=8,
                  frozen_batch=16, cost_repeats=5),
    "small": Size(400, 400, 120, 150, 60, ("gsm8k", "math500", "humaneval", "mt-bench"), 2, 48, ("greedy",), 32,
                    64),
    "full": Size(None, 2600, 800, 1200, 400, ALL_SUITES, 2, 64, ("greedy", "global", "geometric"), 32, 128),
}


def training_prompts(suites_dir) -> list[str]:
    """The demo corpus's prompts: the set shipped with dcoco, then TRAIN_ROWS of each evaluation suite."""
    out = list(corpus.load_prompts())
    for name, n in TRAIN_ROWS.items():
        rows = load_suites([Path(suites_dir) / f"{name}.jsonl"], rows=10 ** 9)[name][EVAL_ROWS_RESERVED:]
        random.Random(0).shuffle(rows)
        out += rows[:n]
    return out


def workdir(size: str, given: tuple | None = None) -> Path:
    """The stages' folder: per size, and per drafter when one is given (given_drafter)."""
    root = cache_dir() / f"demo-{size}"
    return root if given is None else root / f"drafter-{given[2]['recipe']['drafter'][:12]}"


def build_corpus(model, size: Size, progress: bool, taps: tuple[int, ...] = tuple(SMOLLM2_TAPS)) -> corpus.Corpus:
    """The shipped sequences (the first size.sequences) with this machine's features at the target layers taps
    and labels, cached."""
    with resources.as_file(resources.files("dcoco") / "data" / CORPUS_FILE) as shipped:  # the file itself, on disk
        seqs = corpus.load_sequences(shipped)[:size.sequences]
    settings = corpus.CorpusSettings(tuple(taps), max_new_tokens=128)
    return corpus.build_corpus(model, [p for p, _ in seqs], cache_dir() / "corpus", settings, progress=progress,
                               responses=[r for _, r in seqs])


def train_stage(out: Path, cfg: TrainConfig, data: corpus.Corpus, embed, head, drafter, corrector=None,
                progress: bool = True, upstream: dict | None = None,
                corrector_from: dict | None = None) -> tuple[DFlashDrafter, checkpoint.Second | None, dict]:
    """Train once: a stage finished with this recipe (done.json) is loaded, an interrupted one resumed."""
    want = stages.recipe(cfg, upstream, corrector_from)
    info = stages.redo_unless_done(out, want)
    if info is not None:
        d, c = checkpoint.load(out)
        return d, c, info
    t = time.monotonic()
    resume = (out / "train_state.pt").is_file()  # the demo owns its work folder: anything else there is redone
    cfg = dataclasses.replace(cfg, out=str(out), resume=resume, overwrite=not resume)
    res = train(cfg, data, embed, head, drafter, corrector, progress=progress)
    last = res.history[-20:] or [{}]
    info = stages.write(out, want, mode=cfg.mode, steps=res.step, seconds=time.monotonic() - t,
                        **{f"final_{k}": sum(r[k] for r in last) / len(last) for k in last[0]
                           if k not in ("step", "lr")})
    return res.drafter, res.corrector, info


def _key(want: dict) -> str:
    return hashlib.sha256(json.dumps(want, sort_keys=True).encode()).hexdigest()[:12]


def stage_config(mode: str, steps: int, device: str, **kw) -> TrainConfig:
    """A demo stage's TrainConfig: checkpoints in float32 (later stages and the evaluation reload them exactly)."""
    return TrainConfig(mode=mode, steps=steps, device=device, save_every=100, log_every=max(1, steps // 10),
                       save_dtype="float32", **kw)


def given_drafter(path: str | Path, target) -> tuple:
    """(drafter, None, info) for a DFlash checkpoint built on instead of the demo's own DFlash stages: its
    corrector, if any, is left out; info's recipe names it by the sha256 of its weight files, so the stages built
    on it are kept apart from those of any other drafter. ValueError when it is not a drafter for target (the
    embedded SmolLM2-135M-Instruct)."""
    path = Path(path)
    drafter = checkpoint.load(path)[0].float()
    c, t = drafter.config, target.config
    if (c.vocab_size, c.hidden_size) != (t.vocab_size, t.hidden_size) or \
            max(c.target_layer_ids) >= t.num_hidden_layers:
        raise ValueError(f"drafter: {path} is for vocab_size {c.vocab_size}, hidden_size {c.hidden_size} and target "
                         f"layers {c.target_layer_ids}; the demo's target, SmolLM2-135M-Instruct, has "
                         f"{t.vocab_size}, {t.hidden_size} and {t.num_hidden_layers} layers")
    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")):  # one file, or the shards of a sharded checkpoint
        h.update(f.read_bytes())
    return drafter, None, {"mode": "given drafter", "path": str(path), "recipe": {"drafter": h.hexdigest()}}


def train_all(size: Size, work: Path, data: corpus.Corpus, model, tok, device: str, progress: bool,
              given: tuple | None = None) -> dict:
    """{name: (drafter, corrector or selector, info)}: baseline_stages, then from dflash-long and the corrector
    joint_steps joint steps: dcoco-drafter (JOINT_CORR_GRAD) and online (0); and from dflash-long and each
    baseline's frozen-trained head as many steps of that method's published recipe (domino-recipe,
    dspark-recipe). Training mutates its drafter and corrector, hence the copies."""
    out, _ = baseline_stages(size, work, data, model, tok, device, progress, given)
    base = out["dflash-long"]
    embed, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    for name, weight in (("dcoco-drafter", JOINT_CORR_GRAD), ("online", 0.0)):
        cfg = stage_config("joint", size.joint_steps, device, anchors=size.anchors, corr_grad=weight, lr=JOINT_LR)
        out[name] = train_stage(work / name, cfg, data, embed, head, copy.deepcopy(base[0]),
                                copy.deepcopy(out["corrector"][1]), progress=progress, upstream=base[2]["recipe"],
                                corrector_from=out["corrector"][2]["recipe"])
    for method in ("domino", "dspark"):
        cfg = stage_config("joint", size.joint_steps, device, anchors=size.anchors, lr=JOINT_LR, method=method)
        out[f"{method}-recipe"] = train_stage(work / f"{method}-recipe", cfg, data, embed, head,
                                              copy.deepcopy(base[0]), copy.deepcopy(out[method][1]),
                                              progress=progress, upstream=base[2]["recipe"],
                                              corrector_from=out[method][2]["recipe"])
    return out


def baseline_stages(size: Size, work: Path, data: corpus.Corpus, model, tok, device: str,
                    progress: bool, given: tuple | None = None) -> tuple[dict, dict]:
    """({name: (drafter, corrector or selector, info)}, caches) for dflash (from scratch), dflash-long (dflash +
    long_steps over the whole head: the baseline; given_drafter's result when given, and then no dflash) and, on
    the frozen dflash-long drafter's cached outputs (frozen.py, one contract), corrector (DCOCO, L_corr), anchor
    (DCOCO with the anchor transition, beyond the paper), dflash2 (DFlash2's selector), domino and dspark (the
    paper's baselines' heads), corrector_steps each; caches: frozen_stage's, for more frozen stages on the same
    drafter."""
    embed = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings().weight.detach()
    out = {}
    if given is None:
        dcfg = drafter_config(model, tok, LAYERS, SMOLLM2_TAPS, BLOCK, smollm2.MASK_TOKEN_ID)
        first = stage_config("drafter", size.steps, device, anchors=size.anchors, loss_vocab=LOSS_VOCAB)
        out["dflash"] = train_stage(work / "dflash", first, data, embed, head, dcfg, progress=progress)
        long = stage_config("drafter", size.long_steps, device, anchors=size.anchors)
        given = train_stage(work / "dflash-long", long, data, embed, head, copy.deepcopy(out["dflash"][0]),
                            progress=progress, upstream=out["dflash"][2]["recipe"])
    base = out["dflash-long"] = given
    caches: dict[str, tuple[dict[str, torch.Tensor], float]] = {}
    for name, make in frozen_models(base[0], embed).items():
        out[name] = frozen_stage(work / name, make, size.corrector_steps, base, data, embed, head, device, caches,
                                 progress, anchors=size.frozen_anchors, batch=size.frozen_batch)
    return out, caches


def frozen_models(drafter: DFlashDrafter, embed: torch.Tensor) -> dict:
    """{stage name: a function making the fresh model that stage trains on the frozen drafter}, in the demo's order:
    DCOCO's corrector, the anchor-aware one, DFlash2's selector, Domino's and DSpark's heads."""
    d, V = drafter.config.hidden_size, drafter.config.vocab_size
    return {"corrector": lambda: Corrector(d), "anchor": lambda: Corrector(d, anchor_transition=True),
            "dflash2": lambda: CandidateSelector(d, V, SELECTOR_RANK),
            "domino": lambda: DominoHead(d, embed.shape[1], V), "dspark": lambda: DSparkHead(d, V)}


def frozen_stage(out: Path, make, steps: int, base: tuple, data: corpus.Corpus, embed, head, device: str,
                 caches: dict, progress: bool = True, drafts: Path | None = None, anchors: int = FROZEN_ANCHORS,
                 batch: int = FROZEN_BATCH) -> tuple:
    """(drafter, trained corrector or selector, info): make()'s model trained `steps` steps of `batch` blocks on
    the frozen drafter base = (drafter, _, info)'s cached outputs (frozen.py; `anchors` blocks per sequence),
    once: a finished stage is loaded. caches: {drafter recipe key: cache} shared by the calls (each drafter's
    outputs are cached on disk too, in drafts (default: out's parent), keyed by its recipe: a retrained one
    misses)."""
    drafter, _, base_info = base
    want = {"frozen": out.name, "steps": steps, "from": base_info["recipe"],
            **({"anchors": anchors, "batch": batch} if (anchors, batch) != (FROZEN_ANCHORS, FROZEN_BATCH) else {})}
    info = stages.redo_unless_done(out, want)
    if info is not None:
        return drafter, load_frozen(out), info
    key = _key({"from": want["from"], "anchors": anchors} if anchors != FROZEN_ANCHORS else want["from"])
    if key not in caches:
        t = time.monotonic()
        caches[key] = (frozen.build(drafter.to(device).eval(), data, embed.to(device), head.to(device),
                                    anchors=anchors, path=(drafts or out.parent) / f"drafts-{key}.safetensors",
                                    progress=progress), time.monotonic() - t)
    cache, cache_seconds = caches[key]
    torch.manual_seed(0)
    m = make()
    trained = frozen.train(m, cache, embed, head, steps, batch, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"anchor_transition": str(m.anchor_transition).lower(), "num_candidates": str(m.num_candidates)} \
        if isinstance(m, Corrector) else {}  # what checkpoint.read_corrector reads beside the tensors
    save_file(m.state_dict(), str(out / "model.safetensors"), metadata=meta)
    info = stages.write(out, want, mode="frozen drafter, cached outputs", **trained,
                        cached_blocks=len(cache["target"]), cache_seconds=cache_seconds,
                        parameters=sum(p.numel() for p in m.parameters()))
    return drafter, m, info


def load_frozen(path: Path) -> frozen.Model:
    """The model a frozen stage saved in path, told by the tensors it holds: DCOCO's corrector and DSpark's head
    through checkpoint's readers, Domino's head and DFlash2's selector here."""
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        read_here = not keys & {"cand_proj.weight", "markov_w1.weight"}  # checkpoint's readers open the file anew
        sd = {k: f.get_tensor(k) for k in keys} if read_here else {}
    if "cand_proj.weight" in keys:
        return checkpoint.read_corrector(path)
    if "markov_w1.weight" in keys:
        return checkpoint.read_dspark_head(path)
    m: frozen.Model
    if "gru.weight_hh_l0" in sd:
        G, (mid, dg) = sd["gru.weight_hh_l0"].shape[1], sd["mix.weight"].shape
        m = DominoHead(dg - G, sd["gru.weight_ih_l0"].shape[1], sd["out.weight"].shape[0], G, mid)
    else:
        m = CandidateSelector(sd["proj.weight"].shape[1], sd["pred.weight"].shape[0], sd["pred.weight"].shape[1])
    m.load_state_dict(sd)
    return m.eval()


def methods(trained: dict, rules: tuple[str, ...]) -> dict[str, tuple]:
    """{method: (drafter, corrector / selector or None, rule)}, DFlash (dflash-long) first."""
    d0, c0 = trained["dflash-long"][0], trained["corrector"][1]
    d1, c1, _ = trained["dcoco-drafter"]
    d2, c2, _ = trained["online"]
    out = {"DFlash": (d0, None, "greedy"), FROZEN: (d0, c0, "greedy")}
    out.update({f"DCOCO joint {r}": (d1, c1, r) for r in rules})
    out[JOINT_OFF] = (d1, None, "greedy")
    out[ONLINE] = (d2, c2, "greedy")
    out[BUDGET_CONTROL] = (d2, None, "greedy")
    out[DFLASH2] = (d0, trained["dflash2"][1], "greedy")
    out[ANCHOR] = (d0, trained["anchor"][1], "greedy")
    out[DOMINO] = (d0, trained["domino"][1], "greedy")
    out[DSPARK] = (d0, trained["dspark"][1], "greedy")
    for name, stage in ((DOMINO_RECIPE, "domino-recipe"), (DSPARK_RECIPE, "dspark-recipe")):
        out[name] = (trained[stage][0], trained[stage][1], "greedy")
    return out


def eval_texts(names: tuple[str, ...], rows: int, suites_dir=None) -> dict[str, list[str]]:
    """The first rows of each named suite found in suites_dir (default: the paper's suites shipped in
    data/suites; a folder without them: every suite in it)."""
    root = Path(suites_dir) if suites_dir else default_suites()
    files = [root / f"{n}.jsonl" for n in names]
    return load_suites([f for f in files if f.is_file()] or [root], rows)


def evaluate_all(model, engines: dict[str, Engine], prompts: dict[str, list], max_new_tokens: int,
                 progress: bool) -> dict:
    """Greedy decodes of every prompt: target-only, then each engine in turn (evaluate.decode_all).
    {"methods": {name: {"overall", "suites"}}, "lossless": bool, "mismatches": [...]}; rows are spec.summarize
    dicts."""
    per, mismatches = decode_all(model, engines, prompts, max_new_tokens, progress=progress)
    out: dict[str, Any] = {"methods": {}, "lossless": not mismatches, "mismatches": mismatches}
    for m, suites in per.items():
        out["methods"][m] = {"overall": summarize([r for rs in suites.values() for r in rs]),
                             "suites": {s: summarize(rs) for s, rs in suites.items()}}
    return out


def costs(engines: dict[str, Engine], repeats: int = 200) -> dict[str, dict]:
    """Per method with a corrector or selector: parameters, FLOPs per round (one block; corrector.flops) and the
    CPU/GPU time of a round's selection (Engine.draft on one block, R=1) next to the plain argmax's."""
    plain = next(e for e in engines.values() if e.corrector is None)
    c = plain.drafter.config
    h = torch.randn(1, c.block_size, c.hidden_size, generator=torch.Generator().manual_seed(0)).to(plain.embed)
    anchor = torch.zeros(1, dtype=torch.long, device=h.device)

    def seconds(e: Engine) -> float:
        e.draft(h, anchor)  # warm-up
        t = time.perf_counter()
        for _ in range(repeats):
            e.draft(h, anchor)
        return (time.perf_counter() - t) / repeats

    base = seconds(plain)
    out = {}
    for name, e in engines.items():
        if e.corrector is not None:
            out[name] = {"parameters": sum(p.numel() for p in e.corrector.parameters()),
                         "flops_per_round": (e.corrector.flops(c.block_size - 1)
                                             if isinstance(e.corrector, (DominoHead, DSparkHead))
                                             else e.corrector.flops(c.block_size - 1, e.K)),
                         "select_ms_per_round": 1e3 * seconds(e), "argmax_ms_per_round": 1e3 * base}
    return out


def evaluate(model, methods: dict[str, tuple], prompts: dict[str, list], s: Size, device: str,
             progress: bool) -> tuple[dict, dict, dict[str, Engine]]:
    """(sim, ev, engines) for methods = {name: (drafter, corrector / selector / head or None, rule)}, DFlash first:
    tau, its paired CIs (over DFlash, and over each of report.RATIO_BASES evaluated) and coverage from the exact
    greedy simulation of s.sim_rows prompts per suite; tokens/s and the losslessness check from real decoding of
    s.rows of them (evaluate_all)."""
    engines = {name: Engine(model, d.to(device).eval(), None if c is None else c.to(device).eval(), rule=r)
               for name, (d, c, r) in methods.items()}
    t = time.monotonic()
    refs = simulate.references(model, prompts, s.sim_tokens, next(iter(engines.values())).eos,
                               cache_dir() / "references", progress)
    per = simulate.simulate_all(engines, prompts, refs, s.sim_tokens, progress)
    overall = {m: [r for rs in suites.values() for r in rs] for m, suites in per.items()}
    sim = {"methods": simulate.report(per, "DFlash"), "max_new_tokens": s.sim_tokens,  # per suite too
           "ratios": {base: tau_table(overall, base) for base in RATIO_BASES if base in per},  # overall
           "seconds": time.monotonic() - t}
    ev = evaluate_all(model, engines, {n: p[:s.rows] for n, p in prompts.items()}, s.max_new_tokens, progress)
    return sim, ev, engines


def run(size: str = "small", device: str = "cpu", out: str | Path | None = None, suites_dir=None,
        progress: bool = True, drafter: str | Path | None = None) -> dict:
    """Everything `dcoco demo` does; writes {out}/demo-smollm2{-size}.json and plots (out: the work folder).
    drafter: a DFlash checkpoint to build on and compare with instead of the demo's own DFlash stages
    (given_drafter); its JSON and plots then carry the checkpoint folder's name."""
    if size not in SIZES:
        raise ValueError(f"size: expected one of {sorted(SIZES)}, got {size!r}")
    s = SIZES[size]
    t0 = time.monotonic()
    texts = eval_texts(s.suites, s.sim_rows, suites_dir)  # a missing folder fails before the slow stages
    tok, model = load_target(SMOLLM2)
    given = None if drafter is None else given_drafter(drafter, model)
    work = workdir(size, given)
    prompts = encode(tok, texts)
    model.to(device)
    taps = tuple(SMOLLM2_TAPS) if given is None else tuple(given[0].config.target_layer_ids)
    data = build_corpus(model, s, progress, taps)
    trained = train_all(s, work, data, model, tok, device, progress, given)
    sim, ev, engines = evaluate(model, methods(trained, s.rules), prompts, s, device, progress)
    res: dict[str, Any]  # the JSON written below
    dcfg = trained["dflash-long"][0].config
    res = {"size": size, "config": {**dataclasses.asdict(s), "layers": dcfg.num_hidden_layers,
                                    "block_size": dcfg.block_size, "target_layers": list(taps), "device": device,
                                    "drafter": None if given is None else given[2]["path"],
                                    "corpus_sequences": len(data), "corpus_response_tokens":
                                        int(data.response.sum())},
           "training": {k: v[2] for k, v in trained.items()}, "sim": sim, "eval": ev,
           "costs": costs(engines, s.cost_repeats)}
    res["headline"] = report.headline(ev, sim, s.rules, HEADLINE, {"corr_grad": JOINT_CORR_GRAD, "lr": JOINT_LR},
                                      release.provenance(given[2]["path"]) if given is not None else
                                      {"corpus_tokens": int(data.response.sum()), "converged": None})
    res["co_adaptation"] = report.co_adaptation(sim, s.rules, res["training"])
    res["seconds"] = time.monotonic() - t0
    prefix = "demo-smollm2" + ("" if size == "full" else f"-{size}") + ("" if given is None else
                                                                         f"-{Path(given[2]['path']).name}")
    return write(res, Path(out) if out else work, prefix, work)


def write(res: dict, dest: Path, prefix: str, work: Path) -> dict:
    """res with "files" (dest/{prefix}.json and the plots, written) and "work" (the stages' folder) added."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{prefix}.json").write_text(json.dumps(res, indent=2) + "\n")
    res["files"] = [str(dest / f"{prefix}.json"), *map(str, report.plots(res, work, dest, prefix))]
    res["work"] = work
    return res


def show(res: dict) -> None:
    work = res["work"]
    print(report.table(res))
    print(f"checkpoints: {work} (the DCOCO drafter in serving layout: {work / 'dcoco-drafter'}); wrote "
          f"{', '.join(res['files'])}")
