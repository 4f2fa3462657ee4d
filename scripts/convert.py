"""Rule `convert`: the export converted for one GPU (TensorRT engine, fp16 artifact)."""

from pathlib import Path

from deploybench import jobs
from deploybench.convert import convert
from deploybench.models import load_family

smk = snakemake  # noqa: F821 - injected by Snakemake's script directive
jobs.setup_logging(smk.log[0])
family = load_family(smk.params.model["module"], smk.params.model["hparams"])
convert(
    smk.params.converter,
    source=Path(smk.input.export),
    out=Path(smk.output.artifact),
    precision=smk.wildcards.precision,
    inputs=family.inputs,
    max_batch=smk.params.max_batch_size,
)
