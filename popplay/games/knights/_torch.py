"""Torch engine of knights (private; see :mod:`popplay.games.knights.rules`).

All games advance in lockstep, one ply per iteration, as tensors on one device: the
legal moves of every game are the jump-table targets of its (sorted) pieces, masked;
every after-state of every game is evaluated in one batched step (the incremental
pre-activations of the numba engine, gathered per game's network); the chosen moves
are applied with scatters. Finished games stay in the batch, masked. The learners'
after-states are kept per ply and TD(λ) runs backwards over them at the end (the
forward view, as in the numba engine), the gradients of all plies in one batched
pass, scattered into sums per network.

It draws the same words and lists moves in the same order as the numba engine, so
games agree exactly unless two after-state values differ only in the last bits
(library ``exp``, the factored exponentials of :func:`_move_outputs` and summation
order differ between the engines).

With ``lookahead=2`` every move's score is the numba engine's minimax over V: all
replies of every move of every game are evaluated at once, (games, moves, replies,
hidden), in blocks of games that keep that tensor under ``LOOKAHEAD_ELEMENTS``.

Benchmark players: random and greedy; the material search runs on the numba engine.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from popplay.games.knights.rules import KIND_GREEDY, KIND_NET, TORCH_KINDS, make_rules
from popplay.xp import th

_rules = make_rules(th)
_rng = _rules.rng
SYNC_EVERY = 8  # plies between the ply loop's checks that a game is still on
# The two-ply chooser's largest (games, moves, replies, widest layer) block: 2^24 numbers,
# 128 MiB in float64, so a GPU-sized batch is evaluated in a few blocks, not at once.
LOOKAHEAD_ELEMENTS = 1 << 24
# TD(λ) stacks the records of at most 2^24 (ply, game, index) entries at once.
TD_CHUNK_ELEMENTS = 1 << 24


class TorchKnightsEngine:
    """Plays batches of games on one device; weights are fixed during a call."""

    def __init__(self, *, jumps: np.ndarray, pieces: int, max_turns: int, device: str, compile: bool = False,
                 dtype: str = "float64") -> None:
        self.device = torch.device(device)
        table = np.array(jumps, dtype=np.int64)  # a writable copy for torch
        self.squares = table.shape[0] - 1  # the last row serves captured pieces
        self.jumps = torch.as_tensor(table, device=self.device)
        self.k = int(pieces)
        self.max_turns = int(max_turns)
        self.dtype = getattr(torch, dtype)
        self._ply = th.compiled(self._one_ply, compile)

    def _tensor(self, a: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), device=self.device).to(dtype)

    def play(self, nets: Any, lam: Any, kind: Any, net: Any, eps: Any, learn: Any, keys: Any, *,
             base: int, lookahead: Any = 1, td_leaf: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Like :func:`popplay.games.knights._numba.run_games`, but returns the learners'
        TD(λ) sums already added up per network: (result, plies, (networks, P) or None).
        ``lookahead``: one chooser depth for all, or (games, 2) per side; TD-Leaf applies
        to the learners that look two plies deep."""
        depth = np.broadcast_to(np.asarray(lookahead, dtype=np.int64), np.shape(kind))
        if not np.isin(depth, (1, 2)).all():
            raise ValueError(f"lookahead must be 1 or 2, not {np.unique(depth).tolist()}")
        dev = self.device
        S, k = self.squares, self.k
        # Which sides have network players or learners is asked of the host's arrays,
        # never of the device: the ply loop must not wait on the device.
        kind_np, learn_np = np.asarray(kind), np.asarray(learn, dtype=bool)
        if not np.isin(kind_np, TORCH_KINDS).all():
            raise ValueError("the torch engine plays networks, random and greedy only; use the numba engine")
        net_side = [bool((kind_np[:, side] == KIND_NET).any()) for side in range(2)]
        greedy_side = [bool((kind_np[:, side] == KIND_GREEDY).any()) for side in range(2)]
        deep_side = [bool(((kind_np[:, side] == KIND_NET) & (depth[:, side] == 2)).any()) for side in range(2)]
        learn_side = [bool(learn_np[:, side].any()) for side in range(2)]
        kind_t = self._tensor(kind_np, torch.int64)
        w1 = self._tensor(nets.w1, self.dtype)
        n_nets, inputs, hidden = w1.shape
        rows = inputs + 1  # one zero row per network for captured pieces
        w1p = torch.cat([w1, torch.zeros(n_nets, 1, hidden, dtype=w1.dtype, device=dev)], dim=1)
        w1flat = w1p.reshape(-1, hidden)
        b1 = self._tensor(nets.b1, self.dtype)
        w2 = self._tensor(nets.w2, self.dtype)
        b2 = self._tensor(nets.b2, self.dtype)
        wm, bm = (self._tensor(a, self.dtype) for a in nets.middle())  # zero columns: no second layer
        lam_t = self._tensor(lam, self.dtype)
        net_t = self._tensor(net, torch.int64)
        eps_t = self._tensor(eps, self.dtype)
        learn_t = self._tensor(learn, torch.bool)
        deep_t = self._tensor(depth == 2, torch.bool)
        keys_t = self._tensor(keys, torch.int64)
        n = keys_t.shape[0]
        games = torch.arange(n, device=dev)

        # every word counter of the batch, mixed once: no host-to-device copy per ply
        # (the plies' counters padded to whole blocks of SYNC_EVERY: see the ply loop)
        ply_blocks = -(-self.max_turns // SYNC_EVERY) * SYNC_EVERY
        mixed = _rng.mix_counter(torch.arange(base, base + 2 * k + ply_blocks, device=dev))
        remaining = torch.arange(S, S - 2 * k, -1, device=dev)
        # the starting positions: partial Fisher-Yates over the squares
        perm = torch.arange(S, device=dev).repeat(n, 1)
        for i in range(2 * k):
            u = _rng.uniform53(_rng.draw(keys_t, mixed[i]))
            j = i + _rules.pick(u, remaining[i])
            a, b = perm[:, i].clone(), perm[games, j]
            perm[:, i] = b
            perm[games, j] = a
        pieces = torch.stack([perm[:, :k].sort(dim=1).values, perm[:, k:2 * k].sort(dim=1).values], dim=1)
        board = torch.zeros(n, S + 1, dtype=torch.int64, device=dev)  # column S: a dump for no-ops
        board.scatter_(1, pieces[:, 0], 1)
        board.scatter_(1, pieces[:, 1], -1)

        active = torch.ones(n, dtype=torch.bool, device=dev)
        result = torch.zeros(n, dtype=torch.int64, device=dev)
        plies = torch.full((n,), self.max_turns, dtype=torch.int64, device=dev)
        history: list[list[tuple]] = [[], []]
        learning = any(learn_side)
        tables = (w1flat, b1, w2, b2, kind_t, net_t, eps_t, learn_t, rows, inputs, wm, bm, deep_t,
                  self._move_columns(w1p, _factors_fit(nets, 2 * k, self.dtype)))
        plies_done = torch.arange(1, self.max_turns + 1, device=dev)  # as tensors: one graph for every ply
        for ply in range(self.max_turns):
            # The one question a ply loop asks the device, every SYNC_EVERY plies:
            # whether any game is still on (games end at different plies; without
            # it every batch would run to max_turns).
            if ply % SYNC_EVERY == 0 and ply and not bool(active.any()):
                break
            if ply % SYNC_EVERY == 0:  # the next block's words in one draw: fewer, larger operations
                words = _rng.draw(keys_t, mixed[2 * k + ply:2 * k + ply + SYNC_EVERY, None])  # (plies, games)
            side = ply % 2
            pieces, board, active, result, plies, record = self._ply(
                side, net_side[side], greedy_side[side], learn_side[side], deep_side[side], td_leaf,
                plies_done[ply],
                words[ply % SYNC_EVERY], pieces, board, active, result, plies, tables)
            if record is not None:
                history[side].append(record)
        delta = None
        if learning:
            rest = b1.shape[1] + wm.shape[1] * wm.shape[2] + bm.shape[1] + w2.shape[1] + 1  # b1, wm, bm, w2, b2
            # The sums are kept transposed, a row per parameter: the scatters split their
            # work over threads by the axes they do not index, so each thread owns whole
            # rows. Split by hidden unit, two threads added into the same cache lines and
            # the pass ran up to 3x slower. The first layer's sums keep one column per
            # index slot of a record (the pieces' places), added up once at the end.
            d_w1 = torch.zeros(hidden, n_nets * rows, 2 * k, dtype=self.dtype, device=dev)
            d_rest = torch.zeros(rest, n_nets, dtype=self.dtype, device=dev)
            for side in range(2):
                self._td(history[side], side, result, net_t[:, side], lam_t, w2, wm, rows, d_w1, d_rest)
            d_w1 = d_w1.sum(dim=-1).t().reshape(n_nets, rows, hidden)[:, :inputs].reshape(n_nets, -1)
            delta = torch.cat([d_w1, d_rest.t()], dim=1).cpu().numpy()
        return result.to(torch.int8).cpu().numpy(), plies.cpu().numpy(), delta

    def _one_ply(self, side: int, net_here: bool, greedy_here: bool, learn_here: bool, deep_here: bool,
                 td_leaf: bool, ply_done: torch.Tensor, word: torch.Tensor,
                 pieces: torch.Tensor, board: torch.Tensor, active: torch.Tensor, result: torch.Tensor,
                 plies: torch.Tensor, tables: tuple) -> tuple:
        """One ply of every game: the mover (``side``) picks its move, the position and
        results advance; the learner's after-state record when ``learn_here``. Where
        ``deep_here``, some networks look two plies deep (``deep_t``). The flags say
        which kinds of player move on this side, as the host knows them."""
        w1flat, b1, w2, b2, kind_t, net_t, eps_t, learn_t, rows, inputs, wm, bm, deep_t, _ = tables
        deep = deep_t[:, side]
        S = self.squares
        n = pieces.shape[0]
        mover = 1 - 2 * side
        own, opp = pieces[:, side], pieces[:, 1 - side]
        targets = self.jumps[own].reshape(n, -1)  # (n, k·J), −1 off board / captured
        origin = own[:, :, None].expand(-1, -1, self.jumps.shape[1]).reshape(n, -1)
        t_clamped = targets.clamp(min=0)
        occupant = board.gather(1, t_clamped)
        legal = (targets >= 0) & (occupant != mover) & active[:, None]
        capture = legal & (occupant == -mover)
        n_legal = legal.sum(dim=1)
        u = _rules.choice(word)
        random_slot = th.nth_true(legal, _rules.pick(u, n_legal))
        kd = kind_t[:, side]
        slot = random_slot
        if greedy_here:  # the greedy player's own running count only where one plays
            n_capture = capture.sum(dim=1)
            greedy_slot = torch.where(n_capture > 0, th.nth_true(capture, _rules.pick(u, n_capture)), random_slot)
            slot = torch.where(kd == KIND_GREEDY, greedy_slot, random_slot)
        if net_here:
            is_net = kd == KIND_NET
            q = net_t[:, side]
            z0 = self._preactivation(w1flat, b1, q, own, opp, rows)
            y = _move_outputs(z0, q, own, capture, tables)
            if deep_here:
                y = torch.where(deep[:, None],
                                self._two_ply_scores(y, q, own, opp, board, mover, origin, targets, capture, tables), y)
            best_slot = _first_max(torch.where(legal, y, -torch.inf))
            explore = _rules.explores(word, eps_t[:, side])
            slot = torch.where(is_net & ~explore, best_slot, slot)
        moving = n_legal > 0
        f = origin.gather(1, slot[:, None])[:, 0]
        t = targets.gather(1, slot[:, None])[:, 0]
        cap = capture.gather(1, slot[:, None])[:, 0] & moving
        # Selected, not scattered into the ply's input in place: compiled, an input
        # written in place costs a copy of the board and a write-back every ply.
        square = torch.arange(S + 1, device=board.device)
        board = torch.where(moving[:, None] & (square == f[:, None]), 0, board)
        board = torch.where(moving[:, None] & (square == t[:, None]), mover, board)
        own = _sorted_rows(torch.where(moving[:, None] & (own == f[:, None]), t[:, None], own))
        opp = _sorted_rows(torch.where(cap[:, None] & (opp == t[:, None]), S, opp))
        pieces = torch.stack([own, opp] if side == 0 else [opp, own], dim=1)
        record = None
        if learn_here:
            records = learn_t[:, side] & moving
            q = net_t[:, side]
            z = self._preactivation(w1flat, b1, q, own, opp, rows)
            h = _rules.sigmoid(z)
            y, h2 = _output(h, q, w2, b2, wm, bm)
            v = _rules.sigmoid(y)
            index = torch.cat([torch.where(own < S, own, inputs), torch.where(opp < S, S + opp, inputs)], 1)
            record = (records, index, h, h2, v, torch.ones_like(v))
            if td_leaf and deep_here:
                leaf = self._leaf_record(record, q, own, opp, board, mover, tables)
                record = tuple(None if mine is None else torch.where(deep.view(-1, *(1,) * (mine.dim() - 1)),
                                                                     mine, kept)
                               for mine, kept in zip(leaf, record))
        won = moving & ((opp < S).sum(dim=1) == 0)
        result = torch.where(won, mover, result)
        plies = torch.where(won, ply_done, plies)
        active = active & ~won
        return pieces, board, active, result, plies, record

    def _two_ply_scores(self, y_own: torch.Tensor, q: torch.Tensor, own: torch.Tensor, opp: torch.Tensor,
                        board: torch.Tensor, mover: int, origin: torch.Tensor, targets: torch.Tensor,
                        capture: torch.Tensor, tables: tuple) -> torch.Tensor:
        """(games, moves): every move's score under the numba engine's two-ply rule: +inf
        for taking the opponent's last piece (played at once: the first maximum), −1 if
        a reply takes the mover's last piece, V of the mover's after-state (from
        ``y_own``, its output pre-activations) if there is no reply, else 1 − V of the
        opponent's best reply (the same network, planes swapped). Illegal slots carry
        junk; the caller masks them."""
        widest = max(tables[0].shape[1], tables[11].shape[1])  # w1flat's hidden, bm's hidden2
        S, J = self.squares, self.jumps.shape[1]
        n, moves = targets.shape
        t = targets.clamp(min=0)
        # every move's after-state: the moved piece on its target, a taken piece off the board
        moved_piece = (torch.arange(moves, device=own.device) // J)[None, :, None].expand(n, -1, 1)
        own2 = own[:, None, :].expand(-1, moves, -1).scatter(2, moved_piece, t[:, :, None])
        opp2 = torch.where(capture[:, :, None] & (opp[:, None, :] == t[:, :, None]), S, opp[:, None, :])
        wins_now = capture & ((opp2 < S).sum(dim=2) == 0)
        last_piece = ((own < S).sum(dim=1) == 1)[:, None]
        # the board after each move, for the replies' targets (illegal slots: junk, masked later)
        board_after = (board[:, None, :].expand(-1, moves, -1)
                       .scatter(2, origin[:, :, None], 0).scatter(2, t[:, :, None], mover))
        step = max(1, LOOKAHEAD_ELEMENTS // max(1, moves * moves * widest))
        best_reply, any_reply, takes_last = [], [], []
        for lo in range(0, n, step):  # a fixed trip count for given shapes: no device question
            hi = min(n, lo + step)
            _, _, legal, takes, y = self._replies(q[lo:hi], opp2[lo:hi], own2[lo:hi], board_after[lo:hi], mover,
                                                  tables)
            best_reply.append(torch.where(legal, y, -torch.inf).amax(dim=-1))
            any_reply.append(legal.any(dim=-1))
            takes_last.append(takes.any(dim=-1))
        best_reply, any_reply = torch.cat(best_reply), torch.cat(any_reply)
        loses = last_piece & torch.cat(takes_last)
        score = torch.where(any_reply, 1.0 - _rules.sigmoid(best_reply), _rules.sigmoid(y_own))
        score = torch.where(loses, -1.0, score)
        return torch.where(wins_now, torch.inf, score)

    def _leaf_record(self, after: tuple, q: torch.Tensor, own: torch.Tensor, opp: torch.Tensor,
                     board: torch.Tensor, mover: int, tables: tuple) -> tuple:
        """TD-Leaf's record of every game's move (the numba engine's ``_record_leaf``):
        from ``after`` (the after-state's record, used where the opponent has no reply),
        the position after the opponent's best reply by the learner's network, with
        J = 1 − V seen from the opponent (sign −1); J = 1 for a win at once and 0 where a
        reply takes the last piece, without a gradient (sign 0). ``board`` holds the
        after-states."""
        w1flat, b1, w2, b2, rows, inputs, wm, bm = (tables[0], tables[1], tables[2], tables[3], tables[8],
                                                    tables[9], tables[10], tables[11])
        S = self.squares
        records, own_index, own_h, own_h2, own_v, _ = after
        reply_origin, rt, legal, takes, y = self._replies(q, opp, own, board, mover, tables)
        best = _first_max(torch.where(legal, y, -torch.inf))[:, None]
        origin, target = reply_origin.gather(1, best), rt.gather(1, best)
        taken = takes.gather(1, best)
        opp2 = torch.where(opp == origin, target, opp)
        own2 = torch.where(taken & (own == target), S, own)
        h = _rules.sigmoid(self._preactivation(w1flat, b1, q, opp2, own2, rows))
        y_leaf, h2 = _output(h, q, w2, b2, wm, bm)
        leaf_value = 1.0 - _rules.sigmoid(y_leaf)
        index = torch.cat([torch.where(opp2 < S, opp2, inputs), torch.where(own2 < S, S + own2, inputs)], 1)
        has_reply = legal.any(dim=1)
        won = (opp < S).sum(dim=1) == 0
        lost = ((own < S).sum(dim=1) == 1) & takes.any(dim=1)
        value = torch.where(has_reply, leaf_value, own_v)
        value = torch.where(lost, 0.0, value)
        value = torch.where(won, 1.0, value)
        sign = torch.where(has_reply, -1.0, 1.0)
        sign = torch.where(won | lost, 0.0, sign).to(own_v.dtype)
        pick = has_reply[:, None]
        return (records, torch.where(pick, index, own_index), torch.where(pick, h, own_h),
                None if h2 is None else torch.where(pick, h2, own_h2), value, sign)

    def _replies(self, q: torch.Tensor, replier: torch.Tensor, mover_pieces: torch.Tensor, board: torch.Tensor,
                 mover: int, tables: tuple) -> tuple:
        """Every reply of the side to reply (``replier``'s pieces, (games, ..., k); the
        mover's are ``mover_pieces`` and ``board`` (games, ..., squares + 1) is the
        position it replies to), valued by networks ``q`` (games,) from the replier's
        view: (origin, clamped target, legal, takes, output pre-activation), each
        (games, ..., replies). The two-ply chooser and TD-Leaf share it."""
        w1flat, b1, rows = tables[0], tables[1], tables[8]
        k, J = self.k, self.jumps.shape[1]
        lead = replier.shape[:-1]
        reply_target = self.jumps[replier].reshape(*lead, -1)
        reply_origin = replier[..., None].expand(*lead, k, J).reshape(*lead, -1)
        rt = reply_target.clamp(min=0)
        occupant = board.gather(-1, rt)
        legal = (reply_target >= 0) & (occupant != -mover)
        takes = legal & (occupant == mover)
        q_flat = q.view(-1, *(1,) * (len(lead) - 1)).expand(lead).reshape(-1)
        z0 = self._preactivation(w1flat, b1, q_flat, replier.reshape(-1, k), mover_pieces.reshape(-1, k), rows)
        return reply_origin, rt, legal, takes, _move_outputs(z0.view(*lead, -1), q, replier, takes, tables)

    def _move_columns(self, w1p: torch.Tensor, factored: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """The first-layer columns every move touches, per network and origin square:
        the origin's (networks, squares + 1, hidden), the target's and the taken
        piece's (networks, squares + 1, hidden, jumps); off-board targets read square
        0 (their moves are illegal). With the jumps innermost, a piece's moves are one
        contiguous block: compiled, the after-state pass then runs in vector lanes
        where gathering a row per move kept it scalar.

        ``factored``: the target's and the taken piece's columns come as exp(−w) and
        exp(w), so that a move's exp(−z) is a product of per-piece and per-move
        factors (:func:`_move_outputs`). The last flag says which."""
        S = self.squares
        targets = self.jumps.clamp(min=0)  # (squares + 1, jumps)
        origins = torch.arange(S + 1, device=w1p.device).clamp(max=S - 1)  # the captured row: never moves
        to = w1p[:, targets].transpose(-1, -2).contiguous()
        take = w1p[:, S + targets].transpose(-1, -2).contiguous()
        if factored:
            return w1p[:, origins], torch.exp(-to), torch.exp(take), True
        return w1p[:, origins], to, take, False

    def _preactivation(self, w1flat, b1, q, own, opp, rows):
        """b1 + the columns of the pieces (own plane, then the opponent's) of network q."""
        S = self.squares
        base_row = (q * rows)[:, None]
        own_rows = base_row + torch.where(own < S, own, rows - 1)
        opp_rows = base_row + torch.where(opp < S, S + opp, rows - 1)
        return b1[q] + w1flat[own_rows].sum(dim=1) + w1flat[opp_rows].sum(dim=1)

    def _td(self, steps, side, result, q, lam_t, w2, wm, rows, d_w1, d_rest):
        """Backward over one side's after-states: c_t = δ_t + λ c_{t+1}, Σ c_t ∇V(s_t)
        into ``d_w1`` (hidden, networks · rows, indices: one sum per index slot of a
        record, added up by the caller) and ``d_rest`` (b1, then wm and bm of a second
        layer, w2, b2; by networks).

        Only the recursion for c runs ply by ply (a few operations on (games,)); the
        gradients of many plies are one batched pass. A game's gradients of the other
        parameters are summed over its plies before they are added into its network.
        The first layer's are scattered from an expanded view, never copied out once
        per index; on the CPU every sum is in a fixed order, the same on every run and
        for any number of threads."""
        if not steps:
            return
        hidden = wm.shape[1]
        target = _rules.reward(result, 1 - 2 * side).to(w2.dtype)
        c = torch.zeros_like(target)
        lam = lam_t[q]
        latest_first = steps[::-1]
        records, v = (torch.stack([step[i] for step in latest_first]) for i in (0, 4))  # (plies, games)
        weights = []
        for t in range(len(latest_first)):  # v: the estimate J (V, or a TD-Leaf value)
            c = torch.where(records[t], _rules.lambda_return_error(c, target, v[t], lam), c)
            target = torch.where(records[t], v[t], target)
            weights.append(c)
        w2q = w2[q]
        wmq = None if latest_first[0][3] is None else wm[q]
        per_game = 0
        # The stacked records of a GPU-sized batch are large: stacked a chunk of plies
        # at a time.
        chunk = max(1, TD_CHUNK_ELEMENTS // (q.shape[0] * latest_first[0][1].shape[1]))
        for start in range(0, len(latest_first), chunk):
            part = latest_first[start:start + chunk]
            plies = len(part)
            index, h, sign = (torch.stack([step[i] for step in part]) for i in (1, 2, 5))
            c_part, v_part = torch.stack(weights[start:start + chunk]), v[start:start + plies]
            g_out = torch.where(records[start:start + plies], c_part * sign * v_part * (1.0 - v_part),
                                torch.zeros_like(c_part))
            if wmq is None:
                g_h = g_out[..., None] * w2q * h * (1.0 - h)
                parts = [g_h, g_out[..., None] * h, g_out[..., None]]
            else:
                h2 = torch.stack([step[3] for step in part])
                g2 = g_out[..., None] * w2q * h2 * (1.0 - h2)
                g_h = (wmq * g2[..., None, :]).sum(dim=-1) * h * (1.0 - h)
                parts = [g_h, (h[..., :, None] * g2[..., None, :]).flatten(-2), g2, g_out[..., None] * h2,
                         g_out[..., None]]
            # each part summed over the plies, then joined: the same sums, without a
            # (plies, games, parameters) copy of all of them
            per_game = per_game + torch.cat([x.sum(dim=0) for x in parts], dim=-1)
            flat_rows = ((q * rows)[:, None] + index).reshape(1, -1, index.shape[-1])  # (1, plies · games, indices)
            d_w1.scatter_add_(1, flat_rows.expand(hidden, -1, -1),
                              g_h.reshape(-1, hidden).t()[:, :, None].expand(-1, -1, index.shape[-1]))
        d_rest.index_add_(1, q, per_game.t())


def _output(a1: torch.Tensor, q: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor, wm: torch.Tensor,
            bm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Output pre-activations of networks ``q`` (games,) from first-layer activations
    ``a1`` (games, ..., hidden), through the second hidden layer where there is one
    (``bm`` with columns); and that layer's activations (None without it)."""
    lead = (q.shape[0],) + (1,) * (a1.dim() - 2)
    if bm.shape[1] == 0:
        return b2[q].view(lead) + (a1 * w2[q].view(*lead, -1)).sum(dim=-1), None
    flat = a1.reshape(q.shape[0], -1, a1.shape[-1])
    a2 = _rules.sigmoid(torch.bmm(flat, wm[q]) + bm[q][:, None, :]).view(*a1.shape[:-1], -1)
    return b2[q].view(lead) + (a2 * w2[q].view(*lead, -1)).sum(dim=-1), a2


def _move_outputs(z0: torch.Tensor, q: torch.Tensor, pieces: torch.Tensor, capture: torch.Tensor,
                  tables: tuple) -> torch.Tensor:
    """Output pre-activations of every move's after-state, (games, ..., pieces·jumps) in
    the order the moves are listed: from the position's first-layer pre-activations
    ``z0`` (games, ..., hidden), the incremental change of each move (its piece leaves
    its origin, lands on its target, and takes what stands there where ``capture``) by
    networks ``q`` (games,); ``pieces`` (games, ..., k) are the mover's."""
    w2, b2, wm, bm = tables[2], tables[3], tables[10], tables[11]
    w_from, w_to, w_take, factored = tables[13]
    lead, k = pieces.shape[:-1], pieces.shape[-1]
    net = q.view(-1, *(1,) * len(lead))
    jumps = w_to.shape[-1]
    taken = capture.view(*lead, k, 1, jumps)
    if factored:
        # exp(−z) = exp(w_from − z0) · exp(−w_to) · exp(w_take if a capture): one
        # exponential per piece and hidden unit instead of one per move and hidden
        # unit, the move's two factors precomputed per batch (the exponentials were
        # most of a compiled ply). Each factor's rounding adds to exp(−z)'s, a few
        # units in the last place; the factors never leave the dtype's normal range
        # (_factors_fit), so their product is never 0 · inf.
        away = torch.exp(w_from[net, pieces] - z0[..., None, :])  # (games, ..., k, hidden)
        e = away[..., None] * w_to[net, pieces] * torch.where(taken, w_take[net, pieces], 1.0)
        a1 = 1.0 / (1.0 + e)  # (games, ..., k, hidden, jumps)
    else:
        a1 = _rules.sigmoid((z0[..., None, :, None] - w_from[net, pieces][..., None]) + w_to[net, pieces]
                            - taken * w_take[net, pieces])
    y = _output(a1.transpose(-1, -2), q, w2, b2, wm, bm)[0]
    return y.reshape(*lead, k * jumps)


def _factors_fit(nets: Any, indices: int, dtype: torch.dtype) -> bool:
    """Whether every factor of :func:`_move_outputs`' product stays a normal number of
    ``dtype``: a first-layer pre-activation adds b1 to at most ``indices`` columns of
    w1, a move's factors one column each more, so |b1| + (indices + 2)·|w1| bounds
    every exponent. Learning weights this large is rare; past it the moves are
    evaluated one exponential each, as before."""
    bound = float(np.abs(nets.b1).max(initial=0.0)) + (indices + 2) * float(np.abs(nets.w1).max(initial=0.0))
    return bound < -math.log(torch.finfo(dtype).tiny) - 1.0


def _sorted_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row of the integers ``x`` in ascending order, by counting: an entry's place is
    the number of smaller entries plus that of equal ones before it. Rows are short (a
    side's pieces); compiled, this fuses into the ply, where ``sort`` is a library call
    of its own."""
    place = torch.arange(x.shape[-1], device=x.device)
    tied_before = (x[..., None, :] == x[..., :, None]) & (place[None, :] < place[:, None])
    rank = ((x[..., None, :] < x[..., :, None]) | tied_before).sum(dim=-1)  # where each entry goes
    return (x[..., :, None] * (rank[..., :, None] == place)).sum(dim=-2)


# Counted where ``argmax`` would search (the n-th legal move likewise, ``th.nth_true``):
# compiled on a CPU, a count or a minimum over the move slots runs in vector lanes, an
# ``argmax`` one slot at a time (a branch per slot for its NaN rule). Same slots.


def _first_max(values: torch.Tensor) -> torch.Tensor:
    """``values.argmax(dim=1)``: per row the slot of the first maximum, or of the first
    NaN where there is one."""
    best = values.amax(dim=1, keepdim=True)  # NaN where a row has one
    hit = (values == best) | (values != values)
    slots = torch.arange(values.shape[1], device=values.device)
    return torch.where(hit, slots, values.shape[1]).amin(dim=1)
