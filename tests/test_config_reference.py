"""config/config.yaml's `# why: docs/config-reference.md#<anchor>` comments point at sections
that exist, and the page's model and GPU templates are valid configuration."""

from __future__ import annotations

import re
import textwrap
import unicodedata
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from deploybench.planning import workflow_config as dbc

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config" / "config.yaml"
PAGE = REPO / "docs" / "config-reference.md"
SCHEMA = REPO / "config" / "schema" / "config.schema.yaml"


def heading_anchor(heading: str) -> str:
    """The id MkDocs (Python-Markdown's toc extension, default slugify) gives a heading."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def page_anchors() -> list[str]:
    prose = re.sub(r"```.*?```", "", PAGE.read_text(), flags=re.DOTALL)
    return [heading_anchor(h) for h in re.findall(r"^#+ (.+)$", prose, flags=re.MULTILINE)]


def test_config_comments_link_existing_sections():
    anchors = page_anchors()
    assert len(anchors) == len(set(anchors)), "two headings share an anchor"
    linked = set(re.findall(r"docs/config-reference\.md#([\w-]+)", CONFIG.read_text()))
    assert linked, "config.yaml links no section of docs/config-reference.md"
    assert linked <= set(anchors), f"no such section: {sorted(linked - set(anchors))}"


def test_page_links_to_its_own_sections():
    linked = set(re.findall(r"\]\(#([\w-]+)\)", PAGE.read_text()))
    assert linked <= set(page_anchors()), sorted(linked - set(page_anchors()))


def test_templates_are_valid_configuration():
    model_block, gpu_block = (
        yaml.safe_load(textwrap.dedent(block))
        for block in re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)[:2]
    )
    config: dict[str, Any] = yaml.safe_load(CONFIG.read_text())
    (model,) = model_block
    (gpu,) = gpu_block
    config["models"][model] = model_block[model]
    config["gpus"][f"{gpu}-template"] = gpu_block[gpu]
    schema = yaml.safe_load(SCHEMA.read_text())
    jsonschema.Draft202012Validator(schema).validate(config)
    dbc.check_sizings(config, schema)
    for device, precision in ((f"{gpu}-template", "fp16"), ("cpu", "fp32")):
        dbc.resolve(config, model, device, "onnx", precision)
