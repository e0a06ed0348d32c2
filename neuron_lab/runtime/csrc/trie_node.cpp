// The region trie's node as a C type (trie_node.h): ``_runtime_ext.Node``, which ``cache.Node``
// subclasses. The C++ hot path (deferral.cpp) reads its fields from the struct it defines here;
// Python reads and sets them through member descriptors. It takes part in cycle collection: a
// region and its last node refer to each other.
#include "trie_node.h"

#include <pybind11/pybind11.h>
#include <structmember.h>

#include "c_types.h"

namespace py = pybind11;

namespace neuron_lab {
namespace trie {
namespace {

#define NODE_FIELDS(X) \
  X(children) X(region) X(metas) X(structure) X(plan) X(fast) X(key) X(where) X(_new_bytes) \
  X(_alias_outs)

int node_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"depth", "metas", "structure", "where", "key", nullptr};
  Py_ssize_t depth = 0;
  PyObject *metas = Py_None, *structure = Py_None, *where = Py_None, *key = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|nOOOO:Node", const_cast<char**>(names),
                                   &depth, &metas, &structure, &where, &key))
    return -1;
  auto* n = reinterpret_cast<NodeObject*>(self);
  PyObject* children = PyDict_New();
  if (children == nullptr) return -1;
  Py_XSETREF(n->children, children);
  n->depth = depth;
  Py_XSETREF(n->metas, Py_NewRef(metas));
  Py_XSETREF(n->structure, Py_NewRef(structure));
  Py_XSETREF(n->where, Py_NewRef(where));
  Py_XSETREF(n->key, Py_NewRef(key));
  for (PyObject** f : {&n->region, &n->plan, &n->fast, &n->_new_bytes, &n->_alias_outs})
    Py_XSETREF(*f, Py_NewRef(Py_None));
  return 0;
}

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
  c_types::add(m, trie::NodeType, "Node");
}

}  // namespace neuron_lab
