// The test binary's world: MPI ranks under mpirun, a world of one otherwise (set up once by a
// gtest environment in test_communicator.cpp).
#pragma once

#include "hetrain/distributed/communicator.h"

hetrain::distributed::Communicator& world();
