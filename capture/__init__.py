"""torchscope."""
