"""verl-f4: GSPO's ``actor/pg_clipfrac`` counts clipped tokens, as the GSPO paper reports it (convention).

Interpreter: .envs/verl/bin/python (run from the repository root:
``.envs/verl/bin/python findings/repro/verl-f4.py``). Needs only ``pip install verl==0.9.1`` (with its
dependencies torch, transformers, tensordict, omegaconf); imports nothing else.

What it drives: verl 0.9.1's trainer methods ``RayPPOTrainer._compute_old_log_prob``, ``compute_advantage``
(GRPO) and ``RayPPOTrainer._update_actor`` with this process's ``TrainingWorker`` as the actor worker group:
``FSDPEngine.train_batch`` -> ``forward_step`` -> ``verl/workers/utils/losses.py ppo_loss`` ->
``compute_policy_loss_gspo`` (registered ``gspo``), whose logged ``actor/pg_clipfrac`` is
``masked_mean(pg_losses2 > pg_losses1, response_mask)`` over tokens (``core_algos.py:1610``). A tiny Qwen2
is built from a config; FSDP2 over a gloo group of one, fp32.

Setting: ``actor.policy_loss.loss_mode: gspo`` with ``loss_agg_mode: seq-mean-token-mean`` (verl's GSPO
recommendation) and the default clip ratio 0.2; the old log-probs of rows 0 and 2 are 0.5 per token below
the current policy's (a behaviour policy one update behind, as verl's second and later mini-batches of a
step see), so their sequence ratio is e^0.5 = 1.65 and, with positive advantages, both are clipped. Also
runs verl's default ``loss_mode: vanilla`` (token-level PPO) on the same batch.

Expected: GSPO clips whole sequences; the GSPO paper (Zheng et al. 2025, arXiv 2507.18071, section 5.3)
reports "the fractions of clipped tokens", i.e. sum of the lengths of the clipped sequences / all tokens =
(4 + 5) / 14 = 0.6429 here, which is what verl logs; the fraction of clipped sequences (the spec's GSPO-3
statistic) would be 2 / 4 = 0.5. Vanilla PPO: 9 / 14 tokens.

Exit status: 1 while verl logs the token fraction where it differs from the fraction of sequences (the
behaviour the entry documents: the published statistic, a convention, not a wrong number), 0 when verl
logs anything else (a changed metric, to be noticed).

Stand-ins (no GPU, no Ray): verl's CUDA platform subclassed with the CPU's device name and registered
through ``verl.plugin.platform.platform_manager.set_platform`` (verl ships CUDA, NPU and ROCm platforms),
``VERL_ENGINE_DEVICE=cuda`` so ``EngineRegistry`` picks the FSDP engine registered for CUDA, and the
TrainingWorker's methods on an instance built without Ray. None changes the loss or its metrics.
"""

from __future__ import annotations

# ---- harness: verl's own trainer code on the CPU (inlined: nothing of this repository is imported) ----
import importlib
import os
import socket
import sys
import tempfile
from functools import partial
from types import SimpleNamespace

import numpy as np
import torch

PAD, EOS, VOCAB = 0, 1, 16


def cpu_platform():
    """verl ships CUDA, NPU and ROCm platforms only: this stand-in is verl's CUDA platform with the
    CPU's device name and module, registered through verl's own ``set_platform`` extension point. It
    changes where tensors live, not what verl computes."""
    from verl.plugin.platform.platform_cuda import PlatformCUDA

    class Device:
        def __getattr__(self, name):
            if hasattr(torch.cpu, name):
                return getattr(torch.cpu, name)
            if name == "get_device_name":
                return lambda *a, **k: "CPU"
            if name == "mem_get_info":
                return lambda *a, **k: (0, 0)
            if "memory" in name:
                return lambda *a, **k: 0
            raise AttributeError(name)

    class PlatformCPU(PlatformCUDA):
        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: Device())

        def is_available(self):
            return True

        def current_device(self):
            return "cpu"

        def device_count(self):
            return 1

        def set_device(self, device_index):
            return None

        def synchronize(self, device_index=None):
            return None

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def empty_cache(self):
            return None

        def communication_backend_name(self):
            return "gloo"

    return PlatformCPU()


def setup_process():
    """A gloo process group of world size 1; ``VERL_ENGINE_DEVICE=cuda`` makes
    ``EngineRegistry`` pick the FSDP engine it registers for CUDA."""
    import torch.distributed as dist
    from verl.plugin.platform import platform_manager

    os.environ["VERL_ENGINE_DEVICE"] = "cuda"
    if platform_manager.get_platform().device_name != "cpu":
        platform_manager.set_platform(cpu_platform())
    if not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
        }
        for key, value in env.items():
            os.environ.setdefault(key, value)
        dist.init_process_group("gloo", rank=0, world_size=1)


def save_tiny_qwen2(directory, seed=0):
    """A tiny Qwen2 (2 layers, width 32) with random weights and a word-level tokenizer, saved to
    ``directory`` (built from a config in-process: nothing is downloaded)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=2,
    )
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    words = {"<pad>": PAD, "<eos>": EOS, "<bos>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    core = Tokenizer(WordLevel(words, unk_token="<bos>"))
    core.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<bos>"
    ).save_pretrained(directory)
    return directory


class Profiler:  # what TrainingWorker reads of its profiler (disabled)
    rank = 0

    def check_enable(self):
        return False

    def step(self):
        return None


def make_worker(path, rows, group, micro, actor_settings, param_dtype="fp32"):
    """verl's TrainingWorker (its methods on an instance built without Ray) around an initialised
    FSDPEngineWithLMHead (FSDP2, gloo group of 1, no padding removal: the path without flash-attn)
    and verl.workers.utils.losses.ppo_loss with an ActorConfig built from ``actor_settings``."""
    from verl.trainer.config import CheckpointConfig
    from verl.utils.flops_counter import FlopsCounter
    from verl.workers.config import ActorConfig, FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import ppo_loss

    setup_process()
    model_config = HFModelConfig(
        path=path,
        use_remove_padding=False,
        enable_gradient_checkpointing=False,
        override_config={"attn_implementation": "eager"},
    )
    precision = {"param_dtype": param_dtype, "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    engine_config = FSDPEngineConfig(
        strategy="fsdp2",
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=micro,
        infer_micro_batch_size_per_gpu=rows,
        mixed_precision=precision,
        use_torch_compile=False,
        use_remove_padding=False,
        seed=0,
    )
    optimizer_config = FSDPOptimizerConfig(
        lr=1e-2, optimizer="SGD", weight_decay=0.0, clip_grad=1e30, total_training_steps=1
    )
    model_config.model_type = "language_model"
    engine = EngineRegistry.new(
        model_type="language_model",
        backend="fsdp2",
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optimizer_config,
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    actor_config = ActorConfig(
        **{
            "strategy": "fsdp",
            "rollout_n": group,
            "ppo_mini_batch_size": rows // group,
            "ppo_micro_batch_size_per_gpu": micro,
            "use_torch_compile": False,
            **actor_settings,
        }
    )
    worker = object.__new__(TrainingWorker)
    worker.__dict__.update(
        config=SimpleNamespace(model_type="language_model"),
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=optimizer_config,
        engine=engine,
        device_name="cpu",
        flops_counter=FlopsCounter(model_config.hf_config),
        profiler=Profiler(),
        loss_fn=partial(ppo_loss, config=actor_config),
    )
    return worker


def rollout_batch(prompts, responses, group, response_length):
    """The batch as verl's agent loop hands it to the trainer: left-padded prompts, responses
    right-padded to ``rollout.response_length``, attention mask, position ids, uid per group."""
    from verl import DataProto
    from verl.utils.model import compute_position_id_with_mask

    rows, width_p = len(responses), max(len(p) for p in prompts)
    prompt_ids = torch.full((rows, width_p), PAD)
    prompt_mask = torch.zeros((rows, width_p), dtype=torch.long)
    response_ids = torch.full((rows, response_length), PAD)
    response_mask = torch.zeros((rows, response_length), dtype=torch.long)
    for i, response in enumerate(responses):
        prompt = prompts[i // group]
        prompt_ids[i, width_p - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[i, width_p - len(prompt) :] = 1
        response_ids[i, : len(response)] = torch.tensor(response)
        response_mask[i, : len(response)] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": response_ids,
            "input_ids": torch.cat([prompt_ids, response_ids], 1),
            "attention_mask": attention_mask,
            "position_ids": compute_position_id_with_mask(attention_mask),
        },
        non_tensors={"uid": np.array([f"g{i // group}" for i in range(rows)], dtype=object)},
    )


def trainer(worker, group, mini_batch, epochs=1, entropy_coeff=0.0):
    """The parts of RayPPOTrainer that _compute_old_log_prob and _update_actor read, with this
    process's TrainingWorker as the actor worker group."""
    from omegaconf import OmegaConf

    class Group:
        def compute_log_prob(self, td):
            return worker.infer_batch(td)

        def update_actor(self, td):
            return worker.train_mini_batch(td)

    config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"n": group, "temperature": 1.0, "multi_turn": {"enable": False}},
                "actor": {
                    "calculate_entropy": False,
                    "entropy_coeff": entropy_coeff,
                    "calculate_sum_pi_squared": False,
                    "ppo_mini_batch_size": mini_batch,
                    "ppo_epochs": epochs,
                    "data_loader_seed": 0,
                    "shuffle": False,
                },
            }
        }
    )
    return SimpleNamespace(config=config, actor_rollout_wg=Group(), distillation_config=None)


# ---- end of harness ----


PROMPTS = [[2, 3, 4], [2, 5]]
RESPONSES = [[6, 7, 8, 1], [9, 10, 1], [11, 12, 13, 14, 1], [3, 1]]
SCORES = [1.0, 0.0, 1.0, 0.0]  # GRPO advantages +0.71, -0.71, +0.71, -0.71
STALE = [-0.5, 0.0, -0.5, 0.0]  # old log-prob = current - 0.5 on rows 0 and 2: sequence ratio e^0.5 = 1.65


def actor_update(path, actor_settings):
    """RayPPOTrainer._compute_old_log_prob, compute_advantage (GRPO) and _update_actor on the batch,
    with the old log-probs of rows 0 and 2 lowered by 0.5 per token (a behaviour policy one update
    behind: what verl's second and later mini-batches of a step, or its bypass mode's rollout
    log-probs, give). Returns verl's logged metrics."""
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage, compute_response_mask

    worker = make_worker(path, rows=4, group=2, micro=4, actor_settings=actor_settings)
    data = rollout_batch(PROMPTS, RESPONSES, group=2, response_length=6)
    data.batch["response_mask"] = compute_response_mask(data)
    data.meta_info["temperature"] = 1.0
    data.meta_info["global_token_num"] = data.batch["attention_mask"].sum(-1).tolist()
    tr = trainer(worker, group=2, mini_batch=2)
    old, _ = RayPPOTrainer._compute_old_log_prob(tr, data)
    old.batch.pop("entropys")
    data = data.union(old)
    mask = data.batch["response_mask"]
    data.batch["old_log_probs"] = data.batch["old_log_probs"] + torch.tensor(STALE).unsqueeze(-1) * mask
    scores = torch.zeros_like(data.batch["old_log_probs"])
    for i, response in enumerate(RESPONSES):
        scores[i, len(response) - 1] = SCORES[i]
    data.batch["token_level_scores"] = data.batch["token_level_rewards"] = scores
    data = compute_advantage(data, adv_estimator=AdvantageEstimator.GRPO, num_repeat=2)
    metrics = RayPPOTrainer._update_actor(tr, data).meta_info["metrics"]
    value = metrics["actor/pg_clipfrac"]
    return float(value[0] if isinstance(value, list) else value)


def main():
    print(f"verl {importlib.import_module('verl').__version__}, torch {torch.__version__}")
    lengths = [len(r) for r in RESPONSES]
    clipped = [i for i in range(4) if STALE[i] < 0 and SCORES[i] > 0]  # s = 1.65 > 1 + 0.2 with A > 0
    token_share = sum(lengths[i] for i in clipped) / sum(lengths)
    seq_share = len(clipped) / len(RESPONSES)
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny_qwen2(tmp)
        gspo = actor_update(
            path, {"policy_loss": {"loss_mode": "gspo"}, "loss_agg_mode": "seq-mean-token-mean"}
        )
        print(
            f"policy_loss.loss_mode gspo (seq-mean-token-mean, clip_ratio 0.2): "
            f"actor/pg_clipfrac got {gspo:.4f}; "
            f"expected {token_share:.4f} as the GSPO paper reports it (the fraction of clipped tokens, "
            f"{sum(lengths[i] for i in clipped)}/{sum(lengths)}); the fraction of clipped sequences "
            f"(spec GSPO-3) is {seq_share:.4f} ({len(clipped)}/4)"
        )
        vanilla = actor_update(path, {})
        print(
            f"defaults (loss_mode vanilla, token-mean): actor/pg_clipfrac got {vanilla:.4f}; expected "
            f"{token_share:.4f} (PPO clips tokens: every token of rows {clipped} has ratio e^0.5)"
        )
    return 1 if abs(gspo - token_share) < 1e-6 and abs(gspo - seq_share) > 1e-6 else 0


if __name__ == "__main__":
    sys.exit(main())
