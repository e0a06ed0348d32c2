// The region trie's node as a C type (trie_node.h): ``_runtime_ext.Node``, which ``cache.Node``
// subclasses. The C++ hot path (deferral.cpp) reads its fields from the struct it defines here;
// Python reads and sets them through member descriptors. It takes part in cycle collection: a
// region and its last node refer to each other.
#include "trie_node.h"

#include <pybind11/pybind11.h>
#include <structmember.h>

#include "c_types.h"
#include "queued_op.h"

namespace py = pybind11;

namespace neuron_lab {
namespace trie {
namespace {

#define NODE_FIELDS(X) \
  X(children) X(region) X(metas) X(structure) X(plan) X(fast) X(key) X(where) X(_new_bytes) \
  X(_alias_outs)

// A node's fields as Node(depth, metas, structure, where, key) sets them: no children, no
// region, no plan yet. False with an exception set.
bool set_fields(NodeObject* n, Py_ssize_t depth, PyObject* metas, PyObject* structure,
                PyObject* where, PyObject* key) {
  PyObject* children = PyDict_New();
  if (children == nullptr) return false;
  Py_XSETREF(n->children, children);
  n->depth = depth;
  Py_XSETREF(n->metas, Py_NewRef(metas));
  Py_XSETREF(n->structure, Py_NewRef(structure));
  Py_XSETREF(n->where, Py_NewRef(where));
  Py_XSETREF(n->key, Py_NewRef(key));
  for (PyObject** f : {&n->region, &n->plan, &n->fast, &n->_new_bytes, &n->_alias_outs})
    Py_XSETREF(*f, Py_NewRef(Py_None));
  return true;
}

int node_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"depth", "metas", "structure", "where", "key", nullptr};
  Py_ssize_t depth = 0;
  PyObject *metas = Py_None, *structure = Py_None, *where = Py_None, *key = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|nOOOO:Node", const_cast<char**>(names),
                                   &depth, &metas, &structure, &where, &key))
    return -1;
  return set_fields(reinterpret_cast<NodeObject*>(self), depth, metas, structure, where, key)
             ? 0 : -1;
}

// A new node of ``parent``'s type (cache.Node) one op deeper, reached by ``key``, with the
// op's metas, structure and line: what Node(...) makes, without a Python call.
PyObject* child_of(NodeObject* parent, PyObject* key, const queued_op::QueuedOpObject& op) {
  PyTypeObject* type = Py_TYPE(parent);
  PyObject* o = type->tp_alloc(type, 0);
  if (o != nullptr && !set_fields(reinterpret_cast<NodeObject*>(o), parent->depth + 1, op.metas,
                                  op.structure, op.where, key))
    Py_CLEAR(o);
  return o;
}

// Node.extend(records, keys=None): cache._Fields.extend in C. The node at the end of the path
// of the records' keys (or ``keys``, one per record) from this one, each missing node made on
// the way.
PyObject* node_extend(PyObject* self, PyObject* const* argv, Py_ssize_t n) {
  PyObject* records = n >= 1 ? argv[0] : nullptr;
  PyObject* keys = n >= 2 ? argv[1] : Py_None;
  if (n < 1 || n > 2 || !PyList_Check(records) ||
      (keys != Py_None &&
       (!PyList_Check(keys) || PyList_GET_SIZE(keys) != PyList_GET_SIZE(records)))) {
    PyErr_SetString(PyExc_TypeError,
                    "neuron_lab: Node.extend(records: list, keys: list of as many or None)");
    return nullptr;
  }
  NodeObject* node = as_node(self);
  if (node == nullptr) return nullptr;
  Py_INCREF(self);
  PyObject* at = self;
  bool made = false;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); ++i) {
    PyObject* rec = PyList_GET_ITEM(records, i);
    if (!queued_op::is_queued_op(rec)) {
      Py_DECREF(at);
      PyErr_SetString(PyExc_TypeError, "neuron_lab: Node.extend: records must be QueuedOps");
      return nullptr;
    }
    const queued_op::QueuedOpObject& op = queued_op::as_queued_op(rec);
    PyObject* key = keys == Py_None ? op.key : PyList_GET_ITEM(keys, i);
    NodeObject* cur = reinterpret_cast<NodeObject*>(at);
    PyObject* nxt = nullptr;   // borrowed from cur's children, or new
    if (!made) {   // past a new node, every one is new
      nxt = PyDict_GetItemWithError(cur->children, key);
      if (nxt == nullptr && PyErr_Occurred()) {
        Py_DECREF(at);
        return nullptr;
      }
      Py_XINCREF(nxt);
    }
    if (nxt == nullptr) {
      made = true;
      nxt = child_of(cur, key, op);
      if (nxt == nullptr || PyDict_SetItem(cur->children, key, nxt) < 0) {
        Py_XDECREF(nxt);
        Py_DECREF(at);
        return nullptr;
      }
    }
    Py_SETREF(at, nxt);
  }
  return at;
}

PyMethodDef node_methods[] = {
    {"extend", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&node_extend)), METH_FASTCALL,
     "extend(records, keys=None) -> node: the node at the end of the records' key path (or "
     "keys') from this one, each missing node made on the way"},
    {nullptr, nullptr, 0, nullptr}};

#define FIELD(f) , &NodeObject::f
using Fields = c_types::ObjectFields<NodeObject NODE_FIELDS(FIELD)>;
#undef FIELD

#define MEMBER(f) {#f, T_OBJECT, offsetof(NodeObject, f), 0, nullptr},
PyMemberDef node_members[] = {
    NODE_FIELDS(MEMBER)
    {"depth", T_PYSSIZET, offsetof(NodeObject, depth), READONLY, "ops from the root"},
    {nullptr, 0, 0, 0, nullptr}};
#undef MEMBER

}  // namespace

PyTypeObject NodeType = c_types::collected<Fields>(
    "neuron_lab.runtime._runtime_ext.Node", sizeof(NodeObject),
    "Node(depth=0, metas=None, structure=None, where=None, key=None): a region trie node",
    node_init, node_members, true);

}  // namespace trie

void init_trie_node(py::module_& m) {
  trie::NodeType.tp_methods = trie::node_methods;
  c_types::add(m, trie::NodeType, "Node");
}

}  // namespace neuron_lab
