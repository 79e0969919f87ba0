"""Weights moved onto 2 MB pages before timing: what the kernel reports for the memory, not our word."""

import re
import sys

import torch
from torch import nn

from src.engine import hugepages


def _policy() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return re.search(r"\[(\w+)\]", f.read()).group(1)
    except OSError:
        return "absent"


def test_large_weights_are_collapsed_onto_huge_pages_or_the_reason_is_said():
    model = nn.Linear(2048, 2048, bias=False)  # 16 MB: at least 6 whole aligned 2 MB pages inside
    said = hugepages.back_with_huge_pages(model)
    if not sys.platform.startswith("linux") or _policy() in ("never", "absent"):
        assert said.startswith("no: "), said  # this host gives no huge pages: said, not claimed
        return
    collapsed, total = (int(x) for x in re.match(r"(\d+) of (\d+) MB", said).groups())
    assert total == 16 and collapsed >= 12, said
    if "could not be" not in said:  # collapsed now: the kernel's own accounting of the mapping agrees
        assert hugepages.huge_page_bytes(model.weight) >= collapsed * 2**20
    # the weights are the same values on their new pages
    before = model.weight.detach().clone()
    hugepages.back_with_huge_pages(model)
    assert torch.equal(model.weight, before)


def test_small_or_tied_weights_are_left_alone_or_counted_once():
    assert hugepages.back_with_huge_pages(nn.Linear(64, 64)) == "none: no weight of 4 MB or more"
    emb = nn.Embedding(4096, 512)  # 8 MB
    head = nn.Linear(512, 4096, bias=False)
    head.weight = emb.weight  # tied, as Gemma's head is
    model = nn.ModuleDict({"emb": emb, "head": head})
    assert len(hugepages._weights(model)) == 1
