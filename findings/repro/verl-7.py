"""verl-7: bf16 log-probs and entropies from verl's FSDP engine where autocast does not up-cast (latent).

Interpreter: .envs/verl/bin/python (run from the repository root:
``.envs/verl/bin/python findings/repro/verl-7.py``). Needs only ``pip install verl==0.9.1`` (with its
dependencies torch, transformers, tensordict, omegaconf); imports nothing else.

What it drives: ``RayPPOTrainer._compute_old_log_prob`` (verl 0.9.1's trainer method) with this process's
``TrainingWorker.infer_batch`` as the actor worker group, i.e. ``FSDPEngine.forward_step``: the model's
forward and ``prepare_model_outputs`` inside ``torch.autocast(device, mixed_precision.param_dtype)``,
``logprobs_from_logits`` (flash-attn's kernel when installed, else ``logprobs_from_logits_v2``, whose bf16
branch runs ``F.log_softmax`` in the input dtype) and ``entropy_from_logits``. A tiny Qwen2 is built from a
config; FSDP2 over a gloo group of one; no padding removal.

Setting that triggers it: ``mixed_precision.param_dtype: bf16`` (verl's default) on a device whose autocast
leaves ``log_softmax``/``softmax``/``logsumexp`` in bf16 -- the CPU -- without flash-attn. Contrast: param
dtype fp32. On CUDA and ROCm (verl's supported GPUs) the same code runs under ``torch.autocast("cuda")``,
whose policy computes those three ops in float32 (torch's ``ATen/autocast_mode.h``, printed below), so
there the log-probs and entropies are float32 math with or without flash-attn: this script cannot run that
path (no GPU) and checks torch's policy instead.

Expected (spec LOGP-3): log p = log_softmax(logits.float())[label], computed inline from the logits the
engine passed (error < 1e-5); entropy = logsumexp(z) - sum softmax(z) z in float32. Got at the trigger: bf16
log-probs (max error about 1e-2), stored by the trainer as float32 (``.float()``) with the bf16 rounding.

Exit status: 1 when the engine's log-probs or entropies carry bf16 rounding (error > 1e-4) at the trigger.

Stand-ins (no GPU, no Ray): verl's CUDA platform subclassed with the CPU's device name and registered
through ``verl.plugin.platform.platform_manager.set_platform`` (verl ships CUDA, NPU and ROCm platforms),
``VERL_ENGINE_DEVICE=cuda`` so ``EngineRegistry`` picks the FSDP engine registered for CUDA, and the
TrainingWorker's methods on an instance built without Ray; none of them changes what verl computes. The
two wrappers around ``logprobs_from_logits``/``entropy_from_logits`` only record their inputs and outputs.
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


def old_log_probs(path, param_dtype, record):
    """RayPPOTrainer._compute_old_log_prob on the batch below with ``mixed_precision.param_dtype``;
    ``record`` receives (logits, labels, log-probs) as the engine hands them to logprobs_from_logits
    and (logits, entropy) as it hands them to entropy_from_logits."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_response_mask

    prompts = [[2, 3, 4], [2, 5]]
    responses = [[6, 7, 8, 1], [9, 10, 1], [11, 12, 13, 14, 1], [3, 1]]
    worker = make_worker(path, rows=4, group=2, micro=4, actor_settings={}, param_dtype=param_dtype)
    data = rollout_batch(prompts, responses, group=2, response_length=6)
    data.batch["response_mask"] = compute_response_mask(data)
    data.meta_info["temperature"] = 1.0
    data.meta_info["global_token_num"] = data.batch["attention_mask"].sum(-1).tolist()
    record.clear()
    old, _ = RayPPOTrainer._compute_old_log_prob(trainer(worker, group=2, mini_batch=2), data)
    return old


def main():
    from verl.utils import torch_functional as verl_F
    from verl.workers.engine.fsdp import transformer_impl

    record = {}
    logprobs_from_logits, entropy_from_logits = (
        transformer_impl.logprobs_from_logits,
        verl_F.entropy_from_logits,
    )

    def logprobs_recorded(logits, labels, **kwargs):  # records what verl's engine passes; computes nothing
        out = logprobs_from_logits(logits=logits, labels=labels, **kwargs)
        record["logp"] = (logits.detach().clone(), labels.clone(), out.detach().clone())
        return out

    def entropy_recorded(logits):
        out = entropy_from_logits(logits)
        record["entropy"] = (logits.detach().clone(), out.detach().clone())
        return out

    transformer_impl.logprobs_from_logits = logprobs_recorded
    verl_F.entropy_from_logits = entropy_recorded

    print(
        f"verl {importlib.import_module('verl').__version__}, torch {torch.__version__}, device cpu; "
        f"flash-attn cross-entropy available: {verl_F.FLAH_ATTN_CROSS_ENTROPY_LOSS_AVAILABLE}"
    )
    # torch's own autocast policy, from the header this torch wheel ships: the ops in the float32 lists
    # get an AutocastCUDA kernel that runs them in float32; CPU autocast registers none for them.
    header = open(os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "autocast_mode.h")).read()
    fp32_lists = header.split("#define AT_FORALL_FP32(_)")[1].split("#define AT_FORALL_DIFFERENT")[0]
    ops = ("log_softmax", "softmax", "logsumexp")
    listed = [op for op in ops if f"_({op}" in fp32_lists]
    kernels = {
        key: [
            op
            for op in ("aten::log_softmax.int", "aten::softmax.int", "aten::logsumexp")
            if torch._C._dispatch_has_kernel_for_dispatch_key(op, key)
        ]
        for key in ("AutocastCUDA", "AutocastCPU")
    }
    print(f"torch autocast float32 lists (ATen/autocast_mode.h) hold {listed}; kernels registered: {kernels}")
    wrong = False
    with tempfile.TemporaryDirectory() as tmp:
        path = save_tiny_qwen2(tmp)
        for label, param_dtype in (
            ("trigger: param_dtype bf16 (verl's default) on the CPU", "bf16"),
            ("param_dtype fp32", "fp32"),
        ):
            old = old_log_probs(path, param_dtype, record)
            logits, labels, logp = record["logp"]
            exact = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
            err = (logp.float() - exact).abs().max().item()
            ent_logits, ent = record["entropy"]
            p = torch.softmax(ent_logits.float(), -1)
            ent_exact = torch.logsumexp(ent_logits.float(), -1) - (p * ent_logits.float()).sum(-1)
            ent_err = (ent.float() - ent_exact).abs().max().item()
            print(
                f"{label}: logits {logits.dtype}; log-probs: expected float32 math "
                f"log_softmax(logits.float()) "
                f"(error < 1e-5), got {logp.dtype}, max |error| {err:.4g} (old_log_probs stored as "
                f"{old.batch['old_log_probs'].dtype}); entropy: expected float32 math, got {ent.dtype}, "
                f"max |error| {ent_err:.4g}"
            )
            if param_dtype == "bf16":
                wrong = err > 1e-4 or ent_err > 1e-4
    print(
        "on CUDA/ROCm the same engine call runs inside torch.autocast('cuda', bfloat16), which computes "
        "log_softmax/softmax/logsumexp in float32 (list above): not reproducible without a GPU"
    )
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
