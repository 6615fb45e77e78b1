"""A KV cache of fixed slots that outlives a request, so a conversation's next turn prefills only its delta.

One tensor per layer for keys and one for values, ``[slots, kv_heads, capacity + 1, head_dim]``. A slot
holds one token sequence (``SlotKVCache.tokens[s]``: exactly the ids whose keys and values are stored, in
order); position ``p`` of the sequence lives at column ``p``. The last column is scratch: padded query
positions write there and nothing reads it.

The cache is handed to a transformers model as ``past_key_values`` for one forward pass after
:meth:`plan` said which slots the batch rows are, where each query token's key/value goes and how many
columns attention reads. The model calls :meth:`update` once per layer: it scatters the new keys/values
into the slots and returns what attention reads, ``[rows, kv_heads, key_len, head_dim]``. When the batch
rows are the slots ``0..rows-1`` (the running decode batch, kept there by :meth:`swap`) that is a view:
no copy of the cache per step, the cost that dominates decoding long contexts on a CPU. Any other set of
slots (a prefill chunk) is gathered. The attention mask is the caller's 4-D mask (transformers passes a
4-D mask through unchanged), so rows of different lengths share one forward.

Sizes grow on demand (:meth:`reserve`): columns in steps of ``COLUMN_STEP``, slots as needed; the owner
keeps ``slots x (capacity + 1)`` under its budget and evicts to stay there.
"""

from __future__ import annotations

import torch

COLUMN_STEP = 256


class SlotKVCache:
    """Slots of keys/values for every layer of one model (see the module docstring)."""

    is_compileable = False

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.capacity = 0  # usable columns per slot (plus one scratch column)
        self.tokens: list[list[int]] = []  # per slot: the ids stored in it
        self._rows: slice | torch.Tensor = slice(0, 0)
        self._write: torch.Tensor | None = None
        self._key_len = 0

    @staticmethod
    def for_model(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> SlotKVCache:
        config = model.config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return SlotKVCache(config.num_hidden_layers, kv_heads, head_dim, dtype, device)

    # ------------------------------------------------------------------ sizes

    @property
    def num_slots(self) -> int:
        return len(self.tokens)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token's keys and values take over all layers."""
        return 2 * self.num_layers * self.kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.num_slots * (self.capacity + 1) * self.bytes_per_token if self.keys else 0

    @staticmethod
    def round_columns(columns: int) -> int:
        return -(-columns // COLUMN_STEP) * COLUMN_STEP

    def reserve(self, slots: int, columns: int, keep: list[int] | None = None) -> list[int]:
        """Reallocate to ``slots`` slots of at least ``columns`` columns (rounded up to ``COLUMN_STEP``).

        ``keep`` lists the slots whose contents survive, in their new order (default: all, in place);
        the others are dropped. Returns the new index of each kept slot.
        """
        keep = list(range(self.num_slots)) if keep is None else keep
        if len(keep) > slots:
            raise ValueError(f"cannot keep {len(keep)} slots in {slots}")
        capacity = self.round_columns(max(columns, 1))
        width = max((len(self.tokens[s]) for s in keep), default=0)
        if width > capacity:
            raise ValueError(f"a kept slot holds {width} tokens, more than {capacity} columns")
        shape = (slots, self.kv_heads, capacity + 1, self.head_dim)
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for store in (self.keys, self.values):
            for layer in range(self.num_layers):
                new = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if store and keep and width:
                    new[: len(keep), :, :width] = store[layer][:, :, :width].index_select(0, index)
                if len(store) < self.num_layers:
                    store.append(new)
                else:
                    store[layer] = new
        self.tokens = [self.tokens[s] for s in keep] + [[] for _ in range(slots - len(keep))]
        self.capacity = capacity
        return list(range(len(keep)))

    # ------------------------------------------------------------------ slot moves

    def swap(self, a: int, b: int) -> None:
        """Exchange the contents of slots ``a`` and ``b`` (copies only their used columns)."""
        if a == b:
            return
        width = max(len(self.tokens[a]), len(self.tokens[b]))
        if width:
            src = torch.tensor([b, a], device=self.device)
            dst = torch.tensor([a, b], device=self.device)
            for tensor in (*self.keys, *self.values):
                tensor[dst, :, :width] = tensor[src, :, :width]
        self.tokens[a], self.tokens[b] = self.tokens[b], self.tokens[a]

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Make slot ``dst`` hold the first ``length`` tokens of slot ``src``."""
        for tensor in (*self.keys, *self.values):
            tensor[dst, :, :length] = tensor[src, :, :length]
        self.tokens[dst] = self.tokens[src][:length]

    # ------------------------------------------------------------------ one forward pass

    def plan(self, rows: slice | list[int], write_positions: torch.Tensor, key_len: int) -> None:
        """Set up the next forward: batch row ``i`` is slot ``rows[i]``; its query token ``t`` is stored
        at column ``write_positions[i, t]`` (``self.capacity`` = scratch); attention reads ``key_len``
        columns."""
        if key_len > self.capacity:
            raise ValueError(f"key_len {key_len} exceeds the capacity {self.capacity}")
        self._rows = rows if isinstance(rows, slice) else torch.tensor(rows, dtype=torch.long, device=self.device)
        self._write = write_positions
        self._key_len = key_len

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' cache hook: store this layer's new keys/values, return what attention reads."""
        rows, write = self._rows, self._write
        assert write is not None, "SlotKVCache.plan() must come before the forward pass"
        out = []
        for store, new in ((self.keys[layer_idx], key_states), (self.values[layer_idx], value_states)):
            if isinstance(rows, slice):
                row_index = torch.arange(rows.start, rows.stop, device=self.device).unsqueeze(1)
            else:
                row_index = rows.unsqueeze(1)
            # advanced indices on dims 0 and 2 -> the indexed view is [rows, q, kv_heads, head_dim]
            store[row_index, :, write] = new.transpose(1, 2).to(store.dtype)
            if isinstance(rows, slice):
                out.append(store[rows, :, : self._key_len])
            else:
                out.append(store[:, :, : self._key_len].index_select(0, rows))
        return out[0], out[1]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._key_len

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self._key_len, 0
