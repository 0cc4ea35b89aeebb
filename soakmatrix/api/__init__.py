"""The Python API's modules; `soakmatrix` (the package above) re-exports their public names, so
import them from there: `from soakmatrix import load_matrix, plan, run, bisect_flags, bisect_builds,
watch`. docs/api.md is the reference. Nothing here imports Ray, plotly or scipy until a verb runs."""
