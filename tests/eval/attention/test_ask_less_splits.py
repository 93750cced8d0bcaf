"""The ask-less paper's dev/test splits (its Table 6): the shipped ids are what the seeded rule
draws from tau2's base tasks (so every machine has the same), the two splits of a domain are
disjoint and cover it, and their sizes are Table 6's."""

from __future__ import annotations

import hashlib
import json

import pytest

from prour.env.domains import DATA_DIR, split_task_ids
from prour.eval.attention.splits import (
    DEV_SIZES,
    SPLIT_NAMES,
    TEST_SIZES,
    draw_split,
    split_file,
    splits_data,
)

# Table 6 of the ask-less paper: Dataset, Total, Dev, Test
TABLE6 = {"retail": (114, 23, 91), "airline": (50, 10, 40), "telecom": (114, 23, 91)}
# sha256 of the shipped dev ids (domain order, comma-joined): a redraw that changes them fails
SHIPPED_DEV = "0f16ad09a138d24c32869b8b957727240ee7032247dab109b97cc33b5c9957c2"


def shipped() -> dict[str, dict[str, list[str]]]:
    """Domain -> {dev, test} ids, as the packaged files ship them."""
    return {domain: {part: json.loads((DATA_DIR / split_file(domain, part)).read_text())
                     ["task_ids"] for part in ("dev", "test")} for domain in TABLE6}


def test_the_sizes_are_table_6s() -> None:
    for domain, (total, dev, test) in TABLE6.items():
        assert (DEV_SIZES[domain], TEST_SIZES[domain]) == (dev, test)
        ids = shipped()[domain]
        assert (len(ids["dev"]), len(ids["test"])) == (dev, test)
        assert len(split_task_ids(domain, "base")) == total


@pytest.mark.parametrize("domain", list(TABLE6))
def test_dev_and_test_are_disjoint_and_cover_the_domain(domain: str) -> None:
    ids = shipped()[domain]
    assert not set(ids["dev"]) & set(ids["test"])
    base = split_task_ids(domain, "base")
    assert sorted(ids["dev"] + ids["test"]) == sorted(base)
    assert ids["dev"] != base[:len(ids["dev"])]  # drawn, not the first tasks
    assert split_task_ids(domain, SPLIT_NAMES["dev"]) == ids["dev"]
    assert split_task_ids(domain, SPLIT_NAMES["test"]) == ids["test"]


def test_the_shipped_ids_are_the_rule_s_draw_on_every_machine() -> None:
    redrawn = splits_data()  # here, from tau2's installed base tasks
    for name, data in redrawn.items():
        assert json.loads((DATA_DIR / name).read_text()) == data, name
    digest = hashlib.sha256(",".join(i for d in TABLE6 for i in shipped()[d]["dev"])
                            .encode()).hexdigest()
    assert digest == SHIPPED_DEV


def test_the_rule_depends_on_ids_not_on_their_order() -> None:
    ids = [str(i) for i in range(40)]
    dev, test = draw_split(ids, "retail", 8)
    dev_rev, _ = draw_split(list(reversed(ids)), "retail", 8)
    assert set(dev) == set(dev_rev) and len(dev) == 8 and len(test) == 32
    assert dev == sorted(dev, key=ids.index)  # kept in the given order
    assert set(draw_split(ids, "retail", 8, seed=1)[0]) != set(dev)  # the seed matters
    with pytest.raises(ValueError, match="dev split of 41"):
        draw_split(ids, "retail", 41)
