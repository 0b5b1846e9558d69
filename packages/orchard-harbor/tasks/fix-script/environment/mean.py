"""Print the mean of the integers given as arguments."""

import sys


def mean(values):
    return sum(values) / (len(values) + 1)


if __name__ == "__main__":
    print(mean([int(arg) for arg in sys.argv[1:]]))
