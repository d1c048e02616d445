"""KV compaction: after keeping an accepted path, the caches continue exactly like a fresh recompute."""

from __future__ import annotations

import torch

from conftest import VOCAB
from talon_sd.drafters import ModelDrafter
from talon_sd.lm import CausalLM
from talon_sd.tree import DraftTree
from talon_sd.verify import Acceptance


@torch.no_grad()
def fresh_logits(model, ids):
    return model(torch.tensor([ids], device=model.device)).logits[0, -1].float()


def random_tree(root: int, seed: int) -> DraftTree:
    generator = torch.Generator().manual_seed(seed)
    tree = DraftTree.root(root)
    for _ in range(4):
        count = 3
        parents = torch.randint(max(0, tree.size - 3), tree.size, (count,), generator=generator)
        tokens = torch.randperm(VOCAB, generator=generator)[:count]
        tree = tree.extend(parents, tokens, torch.zeros(count))
    return tree


def test_target_cache_after_compaction_equals_recompute(llama_pair, qwen_pair):
    for model, _ in (llama_pair, qwen_pair):
        lm = CausalLM(model)
        committed = [5, 17, 33, 8, 5]
        lm.prefill(torch.tensor(committed[:-1]))
        for step in range(6):
            tree = random_tree(committed[-1], step)
            tree_logits = lm.forward_tree(tree)
            path = tree.paths[step % len(tree.paths)][: 1 + step % 4]
            path_tokens = [int(tree.tokens[i]) for i in path[1:]]
            # every node's logits equal its root-to-node path run alone
            torch.testing.assert_close(tree_logits[path[-1]], fresh_logits(model, committed + path_tokens), atol=1e-4, rtol=1e-4)
            lm.cache.keep(lm.cache.length - tree.size, torch.tensor(path))
            assert lm.cache.length == len(committed) - 1 + len(path)
            committed = committed + path_tokens + [int(tree_logits[path[-1]].argmax())]
        next_logits = lm.forward(torch.tensor([committed[-1]]))[-1]
        torch.testing.assert_close(next_logits, fresh_logits(model, committed), atol=1e-4, rtol=1e-4)


def test_draft_cache_keeps_only_the_accepted_path(llama_pair):
    target, draft = llama_pair
    drafter = ModelDrafter(draft)
    committed = [5, 17, 33, 8]
    drafter.start(torch.tensor(committed))
    for step in range(5):
        drafter.begin_step(committed[-1])
        tree = DraftTree.root(committed[-1])
        root_log_p = drafter.expand(tree, torch.tensor([0]))
        torch.testing.assert_close(root_log_p[0], torch.log_softmax(fresh_logits(draft, committed), -1), atol=1e-4, rtol=1e-4)
        top = root_log_p[0].topk(3).indices
        tree = tree.extend(torch.zeros(3, dtype=torch.long), top, root_log_p[0, top])
        layer2 = drafter.expand(tree, torch.tensor([1, 2, 3]))
        for row in range(3):
            expected = torch.log_softmax(fresh_logits(draft, committed + [int(top[row])]), -1)
            torch.testing.assert_close(layer2[row], expected, atol=1e-4, rtol=1e-4)
        accepted = [int(top[step % 3])] if step % 2 == 0 else []
        bonus = int(layer2[step % 3].argmax()) if accepted else 7
        drafter.accept(tree, Acceptance([0, 1 + step % 3] if accepted else [0], accepted, bonus))
        new_tokens = accepted + [bonus]
        assert drafter.lm.cache.length == len(committed) + len(accepted)  # prefix + kept path, nothing else
        committed = committed + new_tokens


def test_draft_cache_follows_steps_that_draft_nothing(llama_pair):
    """A step with no draft forward (budget 1 from the controller) must still move the draft's context on:
    the next root expansion forwards every token committed meanwhile."""
    _, draft = llama_pair
    drafter = ModelDrafter(draft)
    committed = [5, 17, 33, 8]
    drafter.start(torch.tensor(committed))
    for step in range(6):
        drafter.begin_step(committed[-1])
        tree = DraftTree.root(committed[-1])
        if step % 3 == 2:  # every third step drafts; the others are plain steps
            root_log_p = drafter.expand(tree, torch.tensor([0]))
            torch.testing.assert_close(root_log_p[0], torch.log_softmax(fresh_logits(draft, committed), -1),
                                       atol=1e-4, rtol=1e-4)
        bonus = (7 * step + 3) % VOCAB
        drafter.accept(tree, Acceptance([0], [], bonus))
        committed = committed + [bonus]
    assert drafter.lm.cache.length + len(drafter.pending) == len(committed)


def test_draft_prompt_is_prefilled_by_the_first_draft_forward_only(llama_pair):
    """An online budget that runs only plain steps must not pay the draft's prefill: ``start`` leaves the
    draft cache empty, and the first expansion forwards the prompt and every token committed since."""
    _, draft = llama_pair
    drafter = ModelDrafter(draft)
    committed = [5, 17, 33, 8, 21, 2]
    drafter.start(torch.tensor(committed))
    assert drafter.lm.cache.length == 0
    for step in range(3):  # plain steps: still nothing forwarded
        drafter.begin_step(committed[-1])
        drafter.accept(DraftTree.root(committed[-1]), Acceptance([0], [], 9 + step))
        committed = committed + [9 + step]
    assert drafter.lm.cache.length == 0
    drafter.begin_step(committed[-1])
    root_log_p = drafter.expand(DraftTree.root(committed[-1]), torch.tensor([0]))
    assert drafter.lm.cache.length == len(committed)
    torch.testing.assert_close(root_log_p[0], torch.log_softmax(fresh_logits(draft, committed), -1), atol=1e-4, rtol=1e-4)
    drafter.start(torch.tensor([3, 4]))  # a new generation forgets the old cache until it drafts
    assert drafter.lm.cache.length == 0 and drafter.pending == [3, 4]


def test_the_cache_goes_by_the_keyword_the_model_declares_without_deprecation_warnings(llama_pair, qwen_pair):
    # transformers 5.2x renamed the forward's past_key_values to cache (the old name warns, and goes in 5.40);
    # 5.17-5.1x only know past_key_values. Either way the cache must be the one the model fills.
    import inspect
    import warnings

    for target, _ in (llama_pair, qwen_pair):
        lm = CausalLM(target, "target")
        declared = inspect.signature(target.forward).parameters
        assert lm.cache_keyword in declared
        assert lm.cache_keyword == ("cache" if "cache" in declared else "past_key_values")
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            lm.prefill(torch.tensor([5, 6, 7, 8]))
            logits = lm.forward(torch.tensor([9]))
        assert lm.cache.length == 5
        assert torch.allclose(logits[-1], fresh_logits(target, [5, 6, 7, 8, 9]), atol=1e-4)


def test_the_prompt_catch_up_runs_as_a_forward_of_its_own_and_only_before_the_first_draft_forward(llama_pair):
    """``catch_up`` prefills the prompt (and every token plain steps committed
    before it) apart, so the first expand forwards the root alone; once the prompt is in, a later catch-up stays
    in the first expand (apart it would cost one more forward) and ``catch_up`` says False."""
    _, draft = llama_pair
    drafter = ModelDrafter(draft)
    committed = [5, 17, 33, 8, 21, 2]
    drafter.start(torch.tensor(committed))
    drafter.begin_step(committed[-1])
    drafter.accept(DraftTree.root(committed[-1]), Acceptance([0], [], 9))  # a plain step
    committed = committed + [9]
    drafter.begin_step(committed[-1])
    assert drafter.catch_up() is True
    assert drafter.lm.cache.length == len(committed) - 1 and drafter.pending == [committed[-1]]
    assert drafter.catch_up() is False  # nothing left to forward apart
    root_log_p = drafter.expand(DraftTree.root(committed[-1]), torch.tensor([0]))
    torch.testing.assert_close(root_log_p[0], torch.log_softmax(fresh_logits(draft, committed), -1), atol=1e-4, rtol=1e-4)
    drafter.accept(DraftTree.root(committed[-1]), Acceptance([0], [], 4))
    committed = committed + [4]
    for step in range(2):  # plain steps after a drafted one: their tokens wait for the next first expand
        drafter.begin_step(committed[-1])
        drafter.accept(DraftTree.root(committed[-1]), Acceptance([0], [], 11 + step))
        committed = committed + [11 + step]
    drafter.begin_step(committed[-1])
    assert drafter.catch_up() is False and drafter.catch_up_tokens == 2  # the plain steps' tokens
    root_log_p = drafter.expand(DraftTree.root(committed[-1]), torch.tensor([0]))
    assert drafter.lm.cache.length == len(committed)
    torch.testing.assert_close(root_log_p[0], torch.log_softmax(fresh_logits(draft, committed), -1), atol=1e-4, rtol=1e-4)


def test_steps_write_into_the_reserved_rows_and_a_cropped_row_is_written_again(llama_pair):
    model, _ = llama_pair
    lm = CausalLM(model)
    committed = [5, 17, 33, 8]
    lm.prefill(torch.tensor(committed[:-1]))
    storage = [layer.keys.data_ptr() for layer in lm.cache.cache.layers]
    for token in (9, 21, 4, 30):  # one row a step: no layer's rows move
        lm.forward(torch.tensor([committed[-1]]))
        committed.append(token)
        assert [layer.keys.data_ptr() for layer in lm.cache.cache.layers] == storage
    lm.cache.crop(len(committed) - 3)  # drop the last two rows, then write others over them
    committed = committed[:-2]
    for token in (12, 40):
        logits = lm.forward(torch.tensor([committed[-1]]))[-1]
        torch.testing.assert_close(logits, fresh_logits(model, committed), atol=1e-4, rtol=1e-4)
        committed.append(token)


def test_a_layer_given_other_tensors_drops_its_reserved_room_and_continues_exactly(llama_pair):
    model, _ = llama_pair
    lm = CausalLM(model)
    committed = [5, 17, 33, 8]
    lm.prefill(torch.tensor(committed[:-1]))
    layers = lm.cache.cache.layers
    assert all(layer.buffers is not None for layer in layers)
    for layer in layers:  # as the batched engine pads or drops rows: new tensors, the same content
        layer.keys, layer.values = layer.keys.clone(), layer.values.clone()
    assert all(layer.buffers is None for layer in layers)  # the old room is released at once
    logits = lm.forward(torch.tensor([committed[-1]]))[-1]
    torch.testing.assert_close(logits, fresh_logits(model, committed), atol=1e-4, rtol=1e-4)
    assert all(layer.buffers is not None for layer in layers)
