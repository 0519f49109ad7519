"""The `paged` stack: a continuous-batching engine on the paged-attention kernels (memcheck/kernels/), with the
model code of the three preset families and the same seeded weights as the `hf` stack.

One concept per file, nano-vllm style:
  config.py     ModelSpec (architecture from the transformers config), EngineConfig (workload engine:)
  layers.py     RMSNorm, GatedMLP, Rotary
  attention.py  GQA/MHA attention over the paged K/V cache (Llama, Qwen2, DeepSeek-VL's LM)
  mla.py        multi-head latent attention over a latent-only cache (DeepSeek-V2/V3)
  moe.py        Router (greedy / group_limited_greedy / noaux_tc), Experts, MoE with shared experts
  model.py      CausalLM: decoder stack taking over the transformers model's parameters
  vision.py     VisionEncoder: DeepSeek-VL's towers and aligner (the transformers modules) for image requests
  context.py    StepContext: the batch layout one forward pass reads
  kv_pool.py    KVPool: the cache allocation, per-layer views, page footprint
  sequence.py   Sequence: token ids and the block table that holds their K/V
  block_manager.py  BlockManager: free list, reclaim on free, the KV accounting
  request.py    Request: a Sequence plus engine state (progress, timestamps, images)
  scheduler.py  Scheduler: token budget, chunked prefill, admission, preemption by recompute
  model_runner.py  ModelRunner: packs a batch, runs the model, samples greedily
  graphs.py     DecodeGraphs: CUDA graphs of decode steps per batch-size bucket, pinned input buffer
  kv_meter.py   KVMeter: the paged stack's kv.* metrics, after every step
  workspace.py  the declared activation workspace
  engine.py     Engine: the arrival/schedule/run/finish loop
  tensor_parallel.py  Megatron-style shards of the dense decoder, one process per rank (memcheck/rank_workers.py)
  stack.py      PagedStack: the harness interface
"""
from .stack import PagedStack

__all__ = ["PagedStack"]
