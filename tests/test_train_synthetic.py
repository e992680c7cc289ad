"""The synthetic stream (no data.path): the vectorised walk produces exactly the tokens of its
definition, built token by token, and its state is one integer."""
import torch

from dsdata.train.batches import SyntheticBatches


def walk_by_definition(stream: SyntheticBatches, index: int) -> torch.Tensor:
    """Window `index`: noise token, then next = successor[previous] unless the 10 % noise replaces it."""
    gen = torch.Generator().manual_seed(stream.seed * 1_000_003 + index + 1)
    noise = torch.randint(0, stream.vocab_size, (stream.seq_len + 1,), generator=gen)
    keep_noise = torch.rand(stream.seq_len + 1, generator=gen) < 0.1
    out = [int(noise[0])]
    for t in range(1, stream.seq_len + 1):
        out.append(int(noise[t]) if keep_noise[t] else int(stream.successor[out[-1]]))
    return torch.tensor(out)


def test_vectorised_windows_equal_the_token_by_token_walk():
    for vocab, seq_len, seed in ((97, 300, 3), (2, 1, 0), (16000, 2048, 7), (5, 1025, 1)):
        stream = SyntheticBatches(vocab, seq_len, batch_size=3, seed=seed)
        batch = stream.next_batch(0)
        assert batch.shape == (3, seq_len + 1) and batch.dtype == torch.int64
        for i in range(3):
            assert torch.equal(batch[i], walk_by_definition(stream, i))


def test_state_is_one_integer_and_resumes_the_same_batches():
    stream = SyntheticBatches(64, 32, batch_size=4, seed=5)
    stream.next_batch(0)
    state = stream.state_dict()
    assert state == {"format": "dsdata-synthetic", "seed": 5, "position": 4}
    want = stream.next_batch(1)
    fresh = SyntheticBatches(64, 32, batch_size=4, seed=5)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.next_batch(1), want)
    # The walk is learnable: most tokens follow the permutation.
    follows = (want[:, 1:] == stream.successor[want[:, :-1]]).float().mean()
    assert follows > 0.8
