// privateuse1_profiler.h includes <IActivityProfiler.h> from Kineto's header directory
// (torch/include/kineto), which torch's own build has on its include path and an extension's
// does not: this forwards it to the same header through torch/include (profiler.cpp).
#pragma once
#include <kineto/IActivityProfiler.h>
