def pytest_configure(config):
    config.addinivalue_line("markers", "notebooks: runs the tutorial notebooks (ctest's `notebooks`, once per test command)")
