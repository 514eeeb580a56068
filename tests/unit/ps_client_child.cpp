// The worker side of tests/unit/ps_client_test.cpp's suspension test: a process of its own, so
// that the test can SIGSTOP it in the middle of a PS call. Usage:
//   ps_client_child PORT TIMEOUT_MS SECRET_FILE
// Connects to a one-shard PS on 127.0.0.1:PORT as worker 0 of 1 of job 42 (generation 1)
// with the job secret in SECRET_FILE (hex, mode 0600),
// pulls the shard's one partition of 4 floats and prints them on one line (exit 0); on
// any error prints it and exits 1.
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "common/secret.h"
#include "ps/client.h"
#include "ps/partition.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: ps_client_child PORT TIMEOUT_MS SECRET_FILE\n";
    return 2;
  }
  try {
    dltrain::ps::PsClientOptions o;
    o.job = 42;
    o.generation = 1;
    o.rank = 0;
    o.num_workers = 1;
    o.timeout = std::chrono::milliseconds(std::stoi(argv[2]));
    o.secret = dltrain::read_job_secret_file(argv[3], "SECRET_FILE");
    dltrain::ps::PsClient client({{"127.0.0.1", static_cast<std::uint16_t>(std::stoi(argv[1]))}},
                                 dltrain::ps::make_layout({4}, 4, 1), o);
    client.connect();
    std::vector<float> params(4);
    client.pull(params);
    for (std::size_t i = 0; i < params.size(); ++i) std::cout << (i ? " " : "") << params[i];
    std::cout << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cout << "ps_client_child: " << e.what() << std::endl;
    return 1;
  }
}
