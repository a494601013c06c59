"""The bottom layer: helpers every other layer shares. Standard library only.

May import: nothing from flaxformer_lite, no third-party package. Holds what two layers need
and neither owns (DESIGN.md §1): argument checks and the configuration error (`checks`), atomic
file writes (`io`) and the test-only fault-injection points (`faults`).
"""
