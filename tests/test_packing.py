"""Client state packed per group (``fedjax_het.packing``), each group's round its own
computation (``base.own_computation``) and the op and kernel counters
(``benchmarks/hlo_size.py``)."""
import os
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from fedjax_het import clients as cl
from fedjax_het import packing
from fedjax_het.algorithms import base
from fedjax_het.data.federated import Layout
from fedjax_het.training import checkpoint as ckpt_lib
from fedjax_het.training import experiment
from fedjax_het.training import program

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "benchmarks"))
import hlo_size  # noqa: E402 - benchmarks/: a program's size, used by its scripts


def stacked_tree(n=3):
  """A client state of four dtypes, stacked over ``n`` clients, every value distinct."""
  r = np.arange(n)[:, None]
  return base.ClientState(
      params={"w": jnp.asarray(r * 100 + np.arange(6), jnp.float32).reshape(n, 2, 3),
              "b": jnp.asarray(r * 10 + np.arange(2), jnp.bfloat16)},
      model_state={"count": jnp.asarray(r[:, 0] + 7, jnp.int32), "seen": jnp.asarray(
          np.arange(n * 4).reshape(n, 4) % 3 == 0)},
      opt_state=(jnp.asarray(-r * 100 - np.arange(6), jnp.float32).reshape(n, 6),))


def test_pack_holds_one_buffer_per_dtype_and_unpacks_bit_for_bit():
  tree = stacked_tree()
  packed = packing.pack(tree)
  assert packed.spec.dtypes == ("bfloat16", "float32", "int32", "bool")
  assert {d: b.shape for d, b in packed.buffers.items()} == {
      "bfloat16": (3, 2), "float32": (3, 12), "int32": (3, 1), "bool": (3, 4)}
  # each client's float32 leaves raveled in tree order: w then the momentum
  np.testing.assert_array_equal(
      packed.buffers["float32"][1],
      np.concatenate([100 + np.arange(6), -100 - np.arange(6)]).astype(np.float32))
  chex.assert_trees_all_equal(packing.unpack(packed), tree)
  chex.assert_trees_all_equal_dtypes(packing.unpack(packed), tree)
  # the packed tree's fields read the stacked tree
  chex.assert_trees_all_equal(packed.unpack().params, tree.params)


def test_packed_is_a_pytree_of_its_buffers_with_a_static_spec():
  packed = packing.pack(stacked_tree())
  assert len(jax.tree.leaves(packed)) == 4
  doubled = jax.tree.map(lambda b: b + b, packed)
  assert isinstance(doubled, packing.Packed) and doubled.spec == packed.spec
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(packed)]
  assert paths == ["['bfloat16']", "['float32']", "['int32']", "['bool']"]
  # the client axis maps to one client's tree inside a step (what train_group does)
  row_sum = jax.vmap(packing.on_client(
      lambda c: (c, jnp.sum(c.params["w"])), packed))(packed)[1]
  np.testing.assert_array_equal(row_sum, [15.0, 615.0, 1215.0])
  # eval_shape keeps the spec: abstract states carry it
  abstract = jax.eval_shape(lambda: packing.pack(stacked_tree()))
  assert abstract.spec == packed.spec


def test_pack_like_casts_to_the_groups_dtypes_and_refuses_a_new_structure():
  packed = packing.pack(stacked_tree())
  one = jax.tree.map(lambda a: a[2], packing.unpack(packed))
  drifted = one.replace(params=dict(one.params, b=one.params["b"].astype(jnp.float32)))
  row = packing.pack_like(packed.spec, drifted)
  chex.assert_trees_all_equal(row, jax.tree.map(lambda b: b[2], packed))
  with pytest.raises(ValueError, match="structure changed"):
    packing.pack_like(packed.spec, one.replace(opt_state=()))


def test_pack_with_a_replica_axis_and_ragged_leading_axes():
  tree = jax.tree.map(lambda a: jnp.stack([a, a + 1]), stacked_tree())  # [2, 3, ...]
  packed = packing.pack(tree, lead=2)
  assert packed.buffers["float32"].shape == (2, 3, 12)
  chex.assert_trees_all_equal(packing.unpack(packed), tree)
  with pytest.raises(ValueError, match="leading axes"):
    packing.pack({"a": jnp.zeros((3, 2)), "b": jnp.zeros((4, 2))})


def test_gather_and_scatter_of_a_packed_group_move_whole_clients():
  tree = stacked_tree(4)
  packed = packing.pack(tree)
  idx = jnp.asarray([2, 0, np.iinfo(np.int32).max], jnp.int32)  # a padding slot last
  rows = cl.gather_clients(packed, idx)
  got = packing.unpack(rows)
  np.testing.assert_array_equal(got.params["w"][0], tree.params["w"][2])
  np.testing.assert_array_equal(got.model_state["count"], [9, 7, 0])  # padding: zeros
  new = jax.tree.map(lambda b: (b + 1).astype(b.dtype) if b.dtype != jnp.bool_ else ~b, rows)
  back = packing.unpack(cl.scatter_clients(packed, idx, new))
  np.testing.assert_array_equal(back.model_state["count"], [8, 8, 10, 10])
  np.testing.assert_array_equal(back.params["w"][1], tree.params["w"][1])  # not drawn
  np.testing.assert_array_equal(back.params["w"][2], tree.params["w"][2] + 1)


def test_update_clients_in_place_trains_the_drawn_rows_in_order_by_numpy():
  # each slot reads its client's row as the slots before left it, writes it back; a
  # padding slot (out of range) reads the clamped last row and writes nothing
  tree = stacked_tree(4)
  packed = packing.pack(tree)
  idx = jnp.asarray([2, 0, np.iinfo(np.int32).max], jnp.int32)
  inc = jnp.asarray([10.0, 20.0, 30.0], jnp.float32)

  def fn(row, inc):
    new = jax.tree.map(lambda b: (b + inc).astype(b.dtype) if b.dtype != jnp.bool_ else ~b,
                       row)
    return new, jnp.sum(row.buffers["float32"])
  got, seen = jax.jit(lambda p, i, a: cl.update_clients_in_place(fn, p, i, a))(
      packed, idx, inc)
  want = {d: np.array(b) for d, b in packed.buffers.items()}
  want_seen = []
  for i, a in zip(np.asarray(idx), np.asarray(inc)):
    r = min(int(i), 3)
    want_seen.append(want["float32"][r].sum())
    if i < 4:
      for d, b in want.items():
        b[r] = ~b[r] if d == "bool" else (b[r].astype(np.float32) + a).astype(b.dtype)
  for d, b in want.items():
    np.testing.assert_array_equal(np.asarray(got.buffers[d]), b)
  np.testing.assert_allclose(seen, want_seen, rtol=1e-6)
  # the same state as gathering, mapping and scattering the rows
  rows = cl.gather_clients(packed, idx)
  new, _ = jax.vmap(fn)(rows, inc)
  back = cl.scatter_clients(packed, idx, new)
  chex.assert_trees_all_equal(got.buffers, back.buffers)
  # a negative slot writes nothing either; no slots at all leave the state as it was
  for none in (jnp.asarray([-1], jnp.int32), jnp.zeros((0,), jnp.int32)):
    same, seen = cl.update_clients_in_place(fn, packed, none, jnp.ones(none.shape))
    chex.assert_trees_all_equal(same.buffers, packed.buffers)
    assert seen.shape == none.shape


def test_update_clients_in_place_reads_rows_with_the_evaluations_kernels():
  # a round's shape on CPU: the sampled clients trained in place, then every client of
  # the group evaluated by a lax.map over its rows. Each leaf's slice of a row must be
  # the evaluation's own kernel (the row's index a plain value), not one that also reads
  # the slots' indices: every kernel that slices the group's buffer is one of the
  # evaluation's
  n, d = 6, 8
  spec_tree = {"w": jnp.zeros((n, d, d)), "v": jnp.zeros((n, d, 3))}
  packed = packing.pack(spec_tree)
  x = jnp.ones((5, d))

  def predict(client):
    return jnp.sum((x @ client["w"]) @ client["v"])

  def evaluate(p):
    return jax.lax.map(lambda r: predict(packing.unpack(r)), p)

  def train(p, idx):
    def fn(row, _):
      c = packing.unpack(row)
      g = jax.grad(predict)(c)
      return packing.pack_like(row.spec, jax.tree.map(lambda a, b: a - 0.1 * b, c, g)), 0
    return cl.update_clients_in_place(fn, p, idx, jnp.zeros(idx.shape))[0]

  idx = jnp.asarray([4, 1], jnp.int32)
  both = jax.jit(lambda p, i: evaluate(train(p, i))).lower(packed, idx).compile()
  alone = jax.jit(evaluate).lower(packed).compile()
  shape = f"f32[{n},{packed.buffers['float32'].shape[-1]}]"
  slicing = lambda c: {b for b in hlo_size.kernel_bodies(c)
                       if "dynamic-slice(" in b and shape in b and "dynamic-update-slice" not in b}
  assert slicing(alone)  # the evaluation slices the buffer row by row
  assert slicing(both) == slicing(alone), (
      "the in-place loop's row slices are kernels of their own: "
      f"{len(slicing(both) - slicing(alone))} not among the evaluation's")


def while_program():
  def f(x):
    return jax.lax.while_loop(lambda c: c.sum() < 100, lambda c: c * 2 + 1, x)
  return jax.jit(f).trace(jnp.ones(3)).lower()


def test_hlo_size_counts_each_control_flow_region_as_a_computation():
  # entry: the while; cond: 2 constants, reduce (+ its add), compare; body: 2 constants,
  # 2 broadcasts, multiply, add. Terminators are not counted.
  size = hlo_size.measure(while_program())
  assert size == hlo_size.ProgramSize(total=12, largest=6, computations=3, entry=1,
                                      module=12, largest_uncalled=6)


def test_hlo_size_inlines_calls_and_lowers_for_cuda_without_a_gpu():
  inner = jax.jit(lambda x: jnp.sin(x) * 2.0)  # a call XLA inlines

  def f(x):
    return inner(x) + inner(x + 1.0)
  lowered = jax.jit(f).trace(jnp.ones(3))
  here = hlo_size.measure(lowered.lower())
  cuda = hlo_size.measure(lowered.lower(lowering_platforms=("cuda",)))
  assert here.computations == cuda.computations == 1
  assert here.largest == cuda.largest == here.total  # one computation: the entry
  # the callee counted at each call site when inlined, once as written
  callee = hlo_size.measure(inner.trace(jnp.ones(3)).lower()).total
  assert here.module == here.total - callee
  assert here.largest_uncalled == max(callee, here.total - 2 * callee)


HLO_TEXT = """HloModule m, is_scheduled=true

%region_0.1 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.9 = f32[] add(%a, %b)
}

%fused_computation (param_0.2: f32[8]) -> f32[8] {
  %param_0.2 = f32[8]{0} parameter(0)
  %constant.0 = f32[] constant(2)
  %broadcast.0 = f32[8]{0} broadcast(%constant.0), dimensions={}
  ROOT %mul.0 = f32[8]{0} multiply(%param_0.2, %broadcast.0), metadata={op_name="a"}
}

%fused_computation.1 (param_0.6: f32[8]) -> f32[8] {
  %param_0.6 = f32[8]{0} parameter(0)
  %constant.6 = f32[] constant(2)
  %broadcast.4 = f32[8]{0} broadcast(%constant.6), dimensions={}
  ROOT %mul.2 = f32[8]{0} multiply(%param_0.6, %broadcast.4), metadata={op_name="b"}
}

%fused_computation.2 (param_0.9: f32[8]) -> f32[8] {
  %param_0.9 = f32[8]{0} parameter(0)
  %constant.8 = f32[] constant(3)
  %broadcast.6 = f32[8]{0} broadcast(%constant.8), dimensions={}
  ROOT %mul.3 = f32[8]{0} multiply(%param_0.9, %broadcast.6)
}

%wrapped_slice_computation (param_0.4: f32[16]) -> f32[8] {
  %param_0.4 = f32[16]{0} parameter(0)
  ROOT %slice.1 = f32[8]{0} slice(%param_0.4), slice={[0:8]}
}

ENTRY %main.1 (x.1: f32[16]) -> (f32[8], f32[8], f32[8], f32[]) {
  %x.1 = f32[16]{0} parameter(0)
  %wrapped_slice = f32[8]{0} fusion(%x.1), kind=kLoop, calls=%wrapped_slice_computation
  %f0 = f32[8]{0} fusion(%wrapped_slice), kind=kLoop, calls=%fused_computation
  %f1 = f32[8]{0} fusion(%wrapped_slice), kind=kLoop, calls=%fused_computation.1
  %f2 = f32[8]{0} fusion(%wrapped_slice), kind=kLoop, calls=%fused_computation.2
  %zero = f32[] constant(0)
  %r = f32[] reduce(%f2, %zero), dimensions={0}, to_apply=%region_0.1
  ROOT %t = (f32[8]{0}, f32[8]{0}, f32[8]{0}, f32[]) tuple(%f0, %f1, %f2, %r)
}
"""


def test_kernels_counts_fused_computations_their_distinct_bodies_and_kinds():
  # four fused computations (the wrapped slice one too, called by a fusion op); the
  # first two differ only in names and metadata: one kernel. A reduce's combiner and
  # the entry are no kernels.
  assert hlo_size.kernels(HLO_TEXT) == hlo_size.KernelCount(fusions=4, distinct=3)
  assert str(hlo_size.kernels(HLO_TEXT)) == "4 fused computations, 3 distinct kernels"
  assert hlo_size.kernel_kinds(HLO_TEXT) == {"elementwise": 2, "slice": 1}
  # a constant or a slice bound makes another kernel
  assert hlo_size.kernels(HLO_TEXT.replace("constant(2)\n  %broadcast.4",
                                           "constant(5)\n  %broadcast.4")).distinct == 4


def test_kernels_reads_a_compiled_program():
  # the same fusion on two inputs of one shape, another on a third: fewer distinct
  # kernels than fused computations
  def f(a, b, c):
    return jnp.sin(a) * 2.0 + 1.0, jnp.sin(b) * 2.0 + 1.0, jnp.sin(c) * 3.0 + 1.0
  x = jnp.ones(1000)
  count = hlo_size.kernels(jax.jit(f).trace(x, x + 1, x + 2).lower().compile())
  assert count.fusions >= 3
  assert 2 <= count.distinct < count.fusions
  kinds = hlo_size.kernel_kinds(jax.jit(f).trace(x, x + 1, x + 2).lower().compile())
  assert sum(kinds.values()) == count.distinct


def test_each_groups_round_is_a_computation_of_its_own(tiny_config):
  def size(models):
    exp = experiment.prepare(tiny_config("standalone", models=models))
    state = jax.eval_shape(exp.algorithm.init, jax.random.PRNGKey(0))
    return hlo_size.measure(jax.jit(exp.algorithm.round).trace(state, exp.data).lower())
  one, two = size("tiny"), size("tiny,tiny2")
  # a second architecture adds computations beside the first group's, not ops to the
  # same body: the largest computation stays the 'tiny' group's (in one body the
  # round's entry grew from 461 ops to 613 with the second group)
  assert two.total > 1.6 * one.total
  assert two.largest == one.largest
  assert two.entry < one.entry + 0.1 * (two.total - one.total)


def test_own_computation_traces_its_function_once_and_never_takes_the_other_branch():
  traces = []

  def fn(x, y):
    traces.append(1)  # one per trace of fn
    return {"sum": x + y, "twice": 2 * x}

  run = jax.jit(lambda x, y, w: base.own_computation(fn, (x, y), w))
  x, y = jnp.arange(3.0), jnp.ones(3)
  out = run(x, y, jnp.int32(0))
  # the output shapes and the branch share one trace (it was traced twice before)
  assert len(traces) == 1
  chex.assert_trees_all_close(out, {"sum": np.array([1.0, 2.0, 3.0]),
                                    "twice": np.array([0.0, 2.0, 4.0])})
  # a negative witness (never a pooled label) takes the other branch: the operands of
  # the outputs' shapes, in order (base.stand_ins)
  chex.assert_trees_all_close(run(x, y, jnp.int32(-1)), {"sum": x, "twice": y})


def test_stand_ins_forward_operands_of_the_same_shape_and_dtype_else_zeros():
  shapes = {"a": jax.ShapeDtypeStruct((2,), jnp.float32),
            "b": jax.ShapeDtypeStruct((2,), jnp.float32),
            "c": jax.ShapeDtypeStruct((2,), jnp.int32),
            "d": jax.ShapeDtypeStruct((3,), jnp.float32)}
  f1, f2 = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])
  i1 = jnp.array([5, 6], jnp.int32)
  # each operand stands in once, in leaf order; nothing of shape (3,): zeros; the int
  # operand only for the int output
  got = base.stand_ins(shapes, (i1, (f1, f2)))
  chex.assert_trees_all_equal(got, {"a": f1, "b": f2, "c": i1,
                                    "d": jnp.zeros(3, jnp.float32)})
  got = base.stand_ins(shapes, (f1,))
  chex.assert_trees_all_equal(got, {"a": f1, "b": jnp.zeros(2), "c": jnp.zeros(2, jnp.int32),
                                    "d": jnp.zeros(3)})


def test_own_computation_updates_its_operand_in_place():
  # a round's shape: a loop whose body updates a stacked state inside own_computation;
  # a branch of zeros made XLA copy the state into the conditional's output (a
  # temporary the size of the state), a forwarded operand lets it alias
  rows = 100_000

  def run(state, witness):
    def group(state):
      return jax.lax.fori_loop(
          0, 2, lambda k, s: jax.lax.dynamic_update_index_in_dim(s, s[k] * 1.01, k, 0),
          state)

    def body(carry):
      i, state = carry
      return i + 1, base.own_computation(group, (state,), witness)
    return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, state))[1]

  state = jnp.ones((2, rows), jnp.float32)
  compiled = jax.jit(run, donate_argnums=0).lower(state, jnp.int32(0)).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < state.nbytes / 2
  np.testing.assert_allclose(compiled(jnp.ones((2, rows)), jnp.int32(0))[:, :2],
                             np.full((2, 2), 1.01 ** 3), rtol=1e-6)


def test_a_checkpoint_resumes_in_the_layout_its_record_names(tiny_config, tmp_path):
  exp = experiment.prepare(tiny_config("fedmrl"))
  fns = program.compile_fns(exp)
  state = fns.init(jax.random.PRNGKey(3))
  assert all(packing.is_packed(c) for c in state.clients)
  # the layout written before the packing: every group's client state as a tree
  old = state.replace(clients=tuple(packing.unpack(c) for c in state.clients))

  def write(name, tree, meta, record=True):
    ckpt = ckpt_lib.Checkpointer(str(tmp_path / name), max_to_keep=2, fingerprint={})
    if record:
      ckpt.save(1, tree, meta)
    else:  # as the versions before the layout was recorded wrote it
      ckpt.manager.save(1, args=ocp.args.Composite(
          state=ocp.args.StandardSave(tree),
          meta=ocp.args.JsonSave(dict(meta, fingerprint={}))))
      ckpt.manager.wait_until_finished()
    ckpt.close()
    return ckpt_lib.Checkpointer(str(tmp_path / name), max_to_keep=2, fingerprint={})

  cases = [("trees", old, True, packing.TREE_LAYOUT),
           ("trees_unrecorded", old, False, None),
           ("packed", state, True, packing.PACKED_LAYOUT),
           ("packed_unrecorded", state, False, None)]
  for name, tree, record, layout in cases:
    ckpt = write(name, tree, {"round": 1}, record)
    restored, meta = ckpt.restore_latest(fns.abstract, readers=program.readers(fns.abstract))
    assert meta["round"] == 1 and ckpt.steps() == [1], name  # resumed, not set aside
    assert meta.get("layout") == layout, name
    chex.assert_trees_all_equal(restored, state)
    assert restored.clients[0].buffers["float32"].sharding == (
        fns.abstract.clients[0].buffers["float32"].sharding)
  # a layout this version does not know: refused in one line, the step kept
  ckpt = write("unknown", state, {"round": 1, "layout": "sharded-clients-v9"}, False)
  with pytest.raises(ckpt_lib.UnknownLayoutError, match="'sharded-clients-v9'") as err:
    ckpt.restore_latest(fns.abstract, readers=program.readers(fns.abstract))
  assert "\n" not in str(err.value) and ckpt.steps() == [1]
  # without a reader for trees, a tree checkpoint is refused, not misread
  with pytest.raises(ckpt_lib.UnknownLayoutError, match=packing.TREE_LAYOUT):
    write("trees_again", old, {"round": 1}).restore_latest(fns.abstract)


def test_the_stored_layout_of_an_unrecorded_step():
  assert packing.stored_layout([{"float32": 0, "int32": 0}, {"w": 0}]) == (
      packing.PACKED_LAYOUT)
  assert packing.stored_layout([{"params": {}, "opt_state": {}}]) == packing.TREE_LAYOUT
  assert packing.stored_layout(None) == packing.TREE_LAYOUT
  assert packing.layout_of({"c": packing.pack({"w": jnp.ones((2, 3))})}) == (
      packing.PACKED_LAYOUT)
  assert packing.layout_of({"w": jnp.ones((2, 3))}) == packing.TREE_LAYOUT


def draw_client(key):
  """One client's initial state: leaves of two dtypes drawn from ``key``."""
  k1, k2 = jax.random.split(key)
  return {"w": jax.random.normal(k1, (50_000,)), "b": jax.random.uniform(k2, (3, 2)),
          "step": jax.random.randint(k2, (), 0, 9)}


def test_init_clients_packs_each_clients_own_draw():
  layout = Layout(("tiny", "tiny2"), ((0, 1, 2, 3), (4, 5, 6, 7, 8)), (4, 6), 9, 10)
  rt = base.Runtime(layout)
  key = jax.random.PRNGKey(5)
  packed = jax.jit(lambda k: base.init_clients(rt, 1, draw_client, k))(key)
  chex.assert_shape(packed.buffers["float32"], (6, 50_006))
  # row j: client j's own draw from its key, leaves concatenated per dtype in tree order
  # (row 5 pads the group of five to six: drawn too, as every padded row is)
  keys = jax.random.split(jax.random.fold_in(key, 1), 6)
  for j in range(6):
    own = draw_client(keys[j])
    np.testing.assert_array_equal(packed.buffers["float32"][j],
                                  np.concatenate([np.ravel(own["b"]), own["w"]]))
    np.testing.assert_array_equal(packed.buffers["int32"][j], [own["step"]])


def test_init_clients_draws_one_client_at_a_time():
  # drawn at once, every client's leaves were a temporary as large as the group's state
  rt = base.Runtime(Layout(("tiny",), (tuple(range(8)),), (8,), 8, 10))
  compiled = jax.jit(lambda k: base.init_clients(rt, 0, draw_client, k)).lower(
      jax.random.PRNGKey(0)).compile()
  state_bytes = 8 * 50_007 * 4
  assert compiled.memory_analysis().temp_size_in_bytes < state_bytes / 2


def with_value(packed, dtype, where, value):
  """``packed`` with ``value`` written at ``where`` of its ``dtype`` buffer."""
  buffers = dict(packed.buffers)
  buffers[dtype] = buffers[dtype].at[where].set(value)
  return packing.Packed(buffers, packed.spec)


@pytest.mark.parametrize("where", [(0, 0), (1, 1), (-1, -1)])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_finite_groups_flags_each_non_finite_value_by_numpy(where, bad):
  big = np.finfo(np.float32).max
  groups = [stacked_tree(3), stacked_tree(4)]
  server = {"theta": jnp.full((5,), -big), "n": jnp.arange(3)}
  state = base.State(jnp.zeros((), jnp.int32), jax.random.PRNGKey(0),
                     tuple(packing.pack(g) for g in groups), server)
  check = jax.jit(program.finite_groups)

  def by_numpy(state):  # every float leaf of each group, then of the server
    trees = [packing.unpack(c) for c in state.clients] + [state.server]
    return [all(np.all(np.isfinite(np.asarray(x, np.float64))) for x in jax.tree.leaves(t)
                if jnp.issubdtype(x.dtype, jnp.inexact)) for t in trees]
  np.testing.assert_array_equal(check(state), [True, True, True])  # the largest float too
  # a bad value in the second group's float32 buffer, the first's bfloat16 buffer, the
  # server
  first, second = state.clients
  hit = state.replace(clients=(first, with_value(second, "float32", where, bad)))
  np.testing.assert_array_equal(check(hit), by_numpy(hit))
  np.testing.assert_array_equal(check(hit), [True, False, True])
  hit = state.replace(clients=(with_value(first, "bfloat16", where, bad), second))
  np.testing.assert_array_equal(check(hit), [False, True, True])
  hit = state.replace(server=dict(server, theta=server["theta"].at[where[1]].set(bad)))
  np.testing.assert_array_equal(check(hit), by_numpy(hit))
  np.testing.assert_array_equal(check(hit), [True, True, False])
  # a large buffer (vectorized reductions: a max over it can skip a NaN)
  large = packing.pack({"w": jnp.ones((2, 100_003))})
  hit = state.replace(clients=(with_value(large, "float32", where, bad), second))
  np.testing.assert_array_equal(check(hit), [False, True, True])


def test_replace_on_a_packed_client_state_writes_through():
  stacked = base.ClientState({"w": jnp.arange(6.0).reshape(2, 3)}, None,
                             {"step": jnp.array([1, 2], jnp.int32)})
  packed = packing.pack(stacked)
  new = packed.replace(params={"w": -jnp.ones((2, 3))})
  assert packing.is_packed(new) and new.spec == packed.spec  # still the group's layout
  np.testing.assert_array_equal(new.unpack().params["w"], -np.ones((2, 3)))  # written
  np.testing.assert_array_equal(new.buffers["float32"], -np.ones((2, 3)))
  np.testing.assert_array_equal(new.unpack().opt_state["step"], [1, 2])  # rest untouched
  np.testing.assert_array_equal(packed.unpack().params["w"], np.arange(6.0).reshape(2, 3))
  # a replica axis before the client axis (``loop.run_seeds``) is kept
  two = packing.pack(jax.tree.map(lambda a: jnp.stack([a, a]), stacked), lead=2)
  assert two.replace(opt_state={"step": jnp.zeros((2, 2), jnp.int32)}).buffers[
      "int32"].shape == (2, 2, 1)
  with pytest.raises(ValueError, match="structure changed"):
    packed.replace(params={"w": jnp.ones((2, 3)), "b": jnp.ones((2,))})
  with pytest.raises(ValueError, match="pack_like"):
    packing.pack({"w": jnp.ones((2, 3))}).replace(w=1)


def test_a_field_a_write_could_go_into_is_refused_with_what_to_call():
  stacked = base.ClientState({"w": jnp.arange(6.0).reshape(2, 3)}, jnp.array([3, 4]),
                             ({"mu": jnp.zeros((2, 3))},))
  packed = packing.pack(stacked)
  # params[k] = v on a copy would write nothing: refused, the message names both calls
  for field in ("params", "opt_state"):
    with pytest.raises(packing.PackedReadError,
                       match=rf"^packed client state: \.{field} would be a copy.*"
                             rf"\.unpack\(\)\.{field}.*\.replace\({field}=\.\.\.\)$"):
      getattr(packed, field)
  assert "\n" not in str(pytest.raises(packing.PackedReadError, getattr, packed,
                                       "params").value)
  # a field of arrays only reads through: there is nothing to write into
  np.testing.assert_array_equal(packed.model_state, [3, 4])
  # the explicit copy reads, and replace is the write that sticks
  params = packed.unpack().params
  params["w"] = jnp.zeros((2, 3))
  np.testing.assert_array_equal(packed.buffers["float32"][:, :3], np.arange(6.0).reshape(2, 3))
  written = packed.replace(params=params)
  np.testing.assert_array_equal(written.unpack().params["w"], np.zeros((2, 3)))
  # names a Packed lacks still raise AttributeError (hasattr, copy and pickle probe them)
  assert not hasattr(packed, "shape") and not hasattr(packed, "__array__")
  assert packing.holds_container([jnp.zeros(2)]) and packing.holds_container(({"a": 1},))
  assert not packing.holds_container((jnp.zeros(2), None))
