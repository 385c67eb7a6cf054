"""verl-f3: ``agg_loss``'s Dr. GRPO normaliser defaults to the loss mask's padded width (latent).

Interpreter: .envs/verl/bin/python (run from the repository root:
``.envs/verl/bin/python findings/repro/verl-f3.py``). Needs only ``pip install verl==0.9.1`` (with its
dependencies torch, transformers, tensordict, omegaconf); imports nothing else.

What it drives: (1) ``verl.trainer.ppo.core_algos.agg_loss`` called as ``verl/workers/utils/losses.py
ppo_loss`` calls it (the global batch info, ``loss_scale_factor = config.loss_scale_factor``), in
``loss_agg_mode: seq-mean-token-sum-norm`` with the factor None, so it divides by ``loss_mask.shape[-1]``
(``core_algos.py:1192``): the same tokens padded to width 3 and to width 8 give different losses. (2) verl
0.9.1's trainer methods ``RayPPOTrainer._compute_old_log_prob``, ``compute_advantage`` (GRPO) and
``RayPPOTrainer._update_actor`` with this process's ``TrainingWorker`` (FSDP engine, ``ppo_loss``) at the same
setting on a batch laid out as verl's agent loop lays it out (responses padded to
``rollout.response_length`` = 6; ``left_right_2_no_padding`` records that width and ``no_padding_2_padding``
rebuilds every micro-batch at it), so the divisor is the configured response length, the constant the
maintainers chose on purpose (verl PR #5417, PR #990). A tiny Qwen2 is built from a config; FSDP2 over a
gloo group of one, fp32.

Trigger: a direct call (or any batch not padded to ``rollout.response_length``) with
``loss_agg_mode: seq-mean-token-sum-norm`` and ``actor.loss_scale_factor: null`` (its default). verl's default
``loss_agg_mode: token-mean`` never reaches this branch.

Expected: Dr. GRPO's loss sum_i sum_t m_it l_it / (B * C) with a fixed C: 6 / (2 * 3) = 1.0 at either
width for the direct call; through the trainer, the gradient of that loss with C = response_length = 6 and
B = ppo_mini_batch_size x rollout.n = 4 rows, computed inline on a plain transformers copy of the weights.
Got: 1.0 at width 3 and 0.375 at width 8 (direct call); the trainer's gradient equals the formula's.

Exit status: 1 when the direct call's two widths give different losses.

Stand-ins (no GPU, no Ray): verl's CUDA platform subclassed with the CPU's device name and registered
through ``verl.plugin.platform.platform_manager.set_platform`` (verl ships CUDA, NPU and ROCm platforms),
``VERL_ENGINE_DEVICE=cuda`` so ``EngineRegistry`` picks the FSDP engine registered for CUDA, and the
TrainingWorker's methods on an instance built without Ray. None changes the loss or its normalisation.
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
SCORES = [1.0, 0.0, 0.0, 1.0]
RESPONSE_LENGTH = 6  # rollout.response_length: verl's agent loop pads every response to it


def trainer_gradient(path):
    """RayPPOTrainer._compute_old_log_prob, compute_advantage (GRPO) and _update_actor with
    actor.loss_agg_mode seq-mean-token-sum-norm and loss_scale_factor null (its default); returns
    verl's gradient (read at optimizer_step) and the advantages."""
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage, compute_response_mask

    settings = {"loss_agg_mode": "seq-mean-token-sum-norm", "loss_scale_factor": None}
    worker = make_worker(path, rows=4, group=2, micro=2, actor_settings=settings)
    data = rollout_batch(PROMPTS, RESPONSES, group=2, response_length=RESPONSE_LENGTH)
    data.batch["response_mask"] = compute_response_mask(data)
    data.meta_info["temperature"] = 1.0
    data.meta_info["global_token_num"] = data.batch["attention_mask"].sum(-1).tolist()
    tr = trainer(worker, group=2, mini_batch=2)
    old, _ = RayPPOTrainer._compute_old_log_prob(tr, data)
    old.batch.pop("entropys")
    data = data.union(old)
    scores = torch.zeros_like(data.batch["old_log_probs"])
    for i, response in enumerate(RESPONSES):
        scores[i, len(response) - 1] = SCORES[i]
    data.batch["token_level_scores"] = data.batch["token_level_rewards"] = scores
    data = compute_advantage(data, adv_estimator=AdvantageEstimator.GRPO, num_repeat=2)
    engine, step, grads = worker.engine, worker.engine.optimizer_step, {}

    def optimizer_step():  # reads the accumulated gradient, then lets verl step
        for name, p in engine.module.named_parameters():
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            grads[name] = g.detach().double().clone()
        return step()

    engine.optimizer_step = optimizer_step
    RayPPOTrainer._update_actor(tr, data)
    return grads, data.batch["advantages"][:, 0]


def dr_grpo_gradient(path, advantages, constant):
    """Dr. GRPO's gradient at ratio 1: d/dtheta of
    (1 / (B * C)) sum_i sum_t -A_i * exp(logp_it - sg(logp_it)),
    on a plain transformers copy of the same weights, each row unpadded."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    total = 0.0
    for i, response in enumerate(RESPONSES):
        ids = torch.tensor([PROMPTS[i // 2] + response])
        logits = model(input_ids=ids).logits[0, len(PROMPTS[i // 2]) - 1 : -1]
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)
        total = total + (-float(advantages[i]) * torch.exp(logp - logp.detach())).sum() / (
            len(RESPONSES) * constant
        )
    total.backward()
    return {n: p.grad.double() for n, p in model.named_parameters()}


def main():
    from verl.trainer.ppo.core_algos import agg_loss

    print(f"verl {importlib.import_module('verl').__version__}, torch {torch.__version__}")
    # The trigger: agg_loss as ppo_loss calls it (global batch info, loss_scale_factor None) on the same
    # two rows of three tokens padded to width 3 and to width 8 -- a width verl's pipeline never makes.
    per_token, mask = torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool)
    info = {"dp_size": 1, "batch_num_tokens": 6, "global_batch_size": 2, "loss_scale_factor": None}
    narrow = agg_loss(per_token, mask, "seq-mean-token-sum-norm", **info).item()
    pad = torch.nn.functional.pad
    wide = agg_loss(pad(per_token, (0, 5)), pad(mask, (0, 5)), "seq-mean-token-sum-norm", **info).item()
    print(
        f"trigger (direct call, padded width 3 vs 8): expected equal losses sum / (B * C) for a fixed C "
        f"(C = 3: 6 / (2 * 3) = 1.0000); got {narrow:.4f} at width 3 and {wide:.4f} at width 8"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny_qwen2(tmp)
        got, advantages = trainer_gradient(path)
        want = dr_grpo_gradient(path, advantages, RESPONSE_LENGTH)
        num = sum(float((got[n] - want[n]).square().sum()) for n in want) ** 0.5
        den = sum(float(want[n].square().sum()) for n in want) ** 0.5
        print(
            f"trainer path (seq-mean-token-sum-norm, loss_scale_factor null, rollout.response_length "
            f"{RESPONSE_LENGTH}, 2 micro-batches): expected Dr. GRPO's gradient with C = response_length "
            f"{RESPONSE_LENGTH} (|g| {den:.4g}); got relative error {num / den:.3g}"
        )
    return 1 if abs(narrow - wide) > 1e-6 else 0


if __name__ == "__main__":
    sys.exit(main())
