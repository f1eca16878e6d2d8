"""Sampling from the current checkpoint (stage 2): transformers `generate`, an OpenAI-compatible
server, or vLLM's offline engine. All three answer `generate(conversations, n)` with n texts each.

- hf: `model.generate` in this process. Right for small models and tests; slow for 7B+ models.
- server: an OpenAI-compatible endpoint. With `server_command` set (e.g. "vllm serve {model} --port
  {port}"), the server is started on the round's checkpoint and stopped after sampling; without it
  the endpoints file is used as is (a server you manage).
- vllm: vllm.LLM in this process (GPU hosts with vllm installed); released before training starts.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from typing import Protocol

from cuda_l1.errors import UserError

BACKENDS = ("hf", "server", "vllm")


@dataclass
class Sample:
    """One generated answer."""

    text: str
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model: str = ""
    endpoint: str = ""


class Generator(Protocol):
    sampled_model: str  # the model the answers really come from (a checkpoint path, or a server's model names)

    def generate(self, conversations: list[list[dict]], n: int, on_done=None) -> list[list[Sample]]: ...

    def close(self) -> None: ...


class HFGenerator:
    """transformers generate, one conversation at a time, `batch_size` sequences per call."""

    def __init__(self, model_path: str, model_kwargs: dict, *, max_new_tokens: int, temperature: float,
                 top_p: float, batch_size: int, seed: int = 0, trust_remote_code: bool = False, steer=None):
        import torch

        from cuda_l1.train.modeling import load_tokenizer

        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.tokenizer = load_tokenizer(model_path, "left", trust_remote_code)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, **model_kwargs)
        if torch.cuda.is_available():
            self.model.to("cuda")
        self.model.eval()
        self.model_path = self.sampled_model = model_path
        self.settings = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        if steer is not None:  # (SteerSection, answers): smoke runs of a model that cannot write kernels yet
            from cuda_l1.train.steering import sequence_bias

            self.settings["sequence_bias"] = sequence_bias(self.tokenizer, steer[1], steer[0])
        self.batch_size = max(1, batch_size)
        self.seed = seed

    def generate(self, conversations: list[list[dict]], n: int, on_done=None) -> list[list[Sample]]:
        torch = self.torch
        eos = self.tokenizer.eos_token_id
        out: list[list[Sample]] = []
        for index, messages in enumerate(conversations):
            torch.manual_seed(self.seed + index)  # reproducible per conversation, whatever the batch layout
            encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                         return_dict=True).to(self.model.device)
            prompt_len = encoded["input_ids"].shape[1]
            samples: list[Sample] = []
            while len(samples) < n:
                count = min(self.batch_size, n - len(samples))
                with torch.no_grad():
                    sequences = self.model.generate(**encoded, do_sample=True, num_return_sequences=count,
                                                    pad_token_id=self.tokenizer.pad_token_id, **self.settings)
                for row in sequences:
                    new = row[prompt_len:].tolist()
                    ended = eos in new
                    if ended:
                        new = new[: new.index(eos)]
                    samples.append(Sample(self.tokenizer.decode(new, skip_special_tokens=True),
                                          "stop" if ended else "length", prompt_len, len(new),
                                          self.model_path, "transformers"))
            out.append(samples)
            if on_done:
                on_done(1)
        return out

    def close(self) -> None:
        from cuda_l1.train.modeling import free_accelerator_memory

        del self.model
        free_accelerator_memory()


class ClientGenerator:
    """Any `complete(messages, n)` client (HTTP endpoints or the offline vLLM engine)."""

    def __init__(self, make_client, sampled_model: str, on_close=None):
        self.make_client = make_client  # called inside the event loop: HTTP clients belong to one loop
        self.sampled_model = sampled_model
        self.on_close = on_close

    def generate(self, conversations: list[list[dict]], n: int, on_done=None) -> list[list[Sample]]:
        async def run():
            client = self.make_client()
            try:
                async def one(messages):
                    answers = await client.complete(messages, n)
                    if on_done:
                        on_done(1)
                    return answers

                return await asyncio.gather(*(one(m) for m in conversations))
            finally:
                await client.aclose()

        results = asyncio.run(run())
        return [[Sample(c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens, c.model, c.endpoint)
                 for c in answers if c.ok] for answers in results]

    def close(self) -> None:
        if self.on_close:
            self.on_close()


class ServedModel:
    """A server process we start for one round (`server_command`), stopped by close()."""

    def __init__(self, command: str, model_path: str, port: int, timeout_s: float, log_path: str):
        args = shlex.split(command.format(model=model_path, port=port))
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._log = open(log_path, "ab")
        # A new session, so stopping the server also stops the workers it forks (and nothing else).
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.close()
                raise UserError(f"the model server exited with code {self.proc.returncode} before answering; "
                                f"see {log_path}.")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(2)
        self.close()
        raise UserError(f"the model server did not answer {self.base_url}/models within {timeout_s:g} s; "
                        f"see {log_path}.")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def make_generator(section, model_path: str, model_kwargs: dict, seed: int, log_dir: str,
                   trust_remote_code: bool = False, steer=None) -> Generator:
    """The round's sampler for `model_path` (section: a self-improve GenerationSection; steer:
    (SteerSection, answers) for the hf backend, see steering.py)."""
    from cuda_l1.llm import EndpointConfig, load_endpoints, make_client

    if section.backend == "hf":
        return HFGenerator(model_path, model_kwargs, max_new_tokens=section.max_new_tokens,
                           temperature=section.temperature, top_p=section.top_p, batch_size=section.batch_size,
                           seed=seed, trust_remote_code=trust_remote_code, steer=steer)
    if section.backend == "vllm":
        from cuda_l1.llm.vllm_engine import VLLMEngine

        holder = {"engine": VLLMEngine(model_path, temperature=section.temperature, top_p=section.top_p,
                                       max_tokens=section.max_new_tokens, seed=seed, **section.vllm)}

        def release():  # drop the engine (and its GPU memory) before the round's training starts
            from cuda_l1.train.modeling import free_accelerator_memory

            holder.clear()
            free_accelerator_memory()

        return ClientGenerator(lambda: holder["engine"], model_path, on_close=release)
    if section.backend == "server":
        sampling = dict(temperature=section.temperature, top_p=section.top_p, max_tokens=section.max_new_tokens)
        if section.server_command:
            served = ServedModel(section.server_command, model_path, section.server_port, section.server_timeout_s,
                                 os.path.join(log_dir, "server.log"))
            config = EndpointConfig(base_url=served.base_url, model=model_path, timeout_s=3600.0, **sampling)
            return ClientGenerator(lambda: make_client([config], seed=seed), model_path, on_close=served.close)
        # A server used as is serves whatever it serves, not `model_path` (see off_policy in the config).
        configs = load_endpoints(section.endpoints)
        return ClientGenerator(lambda: make_client(configs, seed=seed), ", ".join(sorted({c.model for c in configs})))
    raise UserError(f"[generation] backend is one of {', '.join(BACKENDS)} (got {section.backend!r}).")
