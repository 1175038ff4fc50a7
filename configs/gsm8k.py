"""DERL on GSM8K (and the MATH+GSM8K mixture) with a Qwen2.5 policy, tested on GSM8K and MATH.

The same fields and paper settings as configs/math.py (see its docstring); only the data
differ. Presets (`--config=configs/gsm8k.py:<preset>`):

  default  train on GSM8K; every final policy tested on GSM8K and MATH test (GSM8K first:
           its exact match is the headline `test` figure):

      python launch/run.py --config=configs/gsm8k.py --mode=search --workdir=runs/gsm8k \\
          --config.policy.checkpoint=/models/Qwen2.5-3B \\
          --config.meta.hf_path=/models/Qwen2.5-0.5B-Instruct \\
          --config.data.train=gsm8k:/data/gsm8k/train.jsonl \\
          --config.data.test=gsm8k:/data/gsm8k/test.jsonl,math:/data/MATH/test.jsonl

           Devices and rough time: as configs/math.py (the 7,473 GSM8K training problems
           give about 94 steps per epoch of the inner-training split at 64 prompts per step).

  mixture  trained on MATH + GSM8K, tested on GSM8K and MATH.

  authors_batch  `default` at the batch of the authors' scripts (1,024 prompts per step, 64-prompt
           minibatches, 2 epochs; configs/math.py), 8 H200 with mesh data=4 model=2.

  tiny     the pipeline on this CPU in a few minutes (trained on the tiny GSM8K file):

      python -m derl_jax.domains.math --write_tiny_data=/tmp/derl_math_tiny
      python launch/run.py --config=configs/gsm8k.py:tiny --mode=compare --workdir=runs/gsm8k_tiny
"""

from __future__ import annotations

import ml_collections

from configs import math as math_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of preset `arg`: "default" (None or empty), "mixture", "authors_batch" or "tiny"."""
    return math_config.build(arg, test_source="gsm8k")
