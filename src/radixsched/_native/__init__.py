"""The native scheduling core: C++ sources compiled into ``_core`` by the package's build
(CMakeLists.txt at the repository root). Import it through ``radixsched.native``, which falls
back to the Python reference when it is missing or turned off."""
