// The region trie's node (``cache.Node``): a C type the runtime's C++ reads field by field, and
// Python reads and writes through its members (trie_node.cpp). One node per op key on a path of
// the trie; what the key determines is the same for every region through it, so it lives here.
#pragma once

#include <Python.h>

#include "c_types.h"

namespace neuron_lab::trie {

struct NodeObject {
  PyObject_HEAD
  PyObject* children;     // {key: Node}
  PyObject* region;       // cache.Region ending here, or None
  Py_ssize_t depth;       // ops from the root
  PyObject* metas;        // the op's OutMeta per output
  PyObject* structure;    // the op's output structure (record.structure_of)
  PyObject* plan;         // output_plans.out_plan: tuple of OutSpec, set at its first deferral,
                          // or None
  PyObject* fast;         // output_plans.FastOut, False when the op is not that simple, or None
  PyObject* key;          // the key leading here from the parent (None at the root)
  PyObject* where;        // the user's line that issued the op when it was recorded
  PyObject* _new_bytes;   // Node.new_bytes, computed once, or None
  PyObject* _alias_outs;  // Node.alias_outs, computed once, or None
};

extern PyTypeObject NodeType;

// ``o`` as a node (the type or a subclass), or nullptr with a TypeError set.
inline NodeObject* as_node(PyObject* o) {
  return c_types::as<NodeObject>(o, NodeType, "a region trie node");
}

}  // namespace neuron_lab::trie
