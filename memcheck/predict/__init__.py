"""GPU memory predicted on a CPU runner: fake tensors on a fake CUDA device, replayed through a model of the
caching allocator."""
