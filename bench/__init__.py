"""The benchmark kit: proxy, EPP, backend and policy benchmarks, the peers and mocks they run
against, and the instruction-count harness."""
