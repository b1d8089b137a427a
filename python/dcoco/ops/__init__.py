"""The op layer: the compiled core as torch.library ops (fused), their argument checks (checks), the native
PyTorch backend of the same math (native), the choice between them per device (backend), path selection on a score
grid (select) and a launch counter (launches)."""
