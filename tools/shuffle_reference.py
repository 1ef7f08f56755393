# Independent reference for DataLoader's documented shuffle: PCG32 (pcg32_srandom_r seeding),
# Lemire bounded draw, Fisher-Yates from the back, state splitmix64(seed ^ splitmix64(epoch)), stream epoch.
M = (1 << 64) - 1
def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)
class Pcg:
    def __init__(s, initstate, initseq):
        s.state = 0; s.inc = ((initseq << 1) | 1) & M
        s.next(); s.state = (s.state + initstate) & M; s.next()
    def next(s):
        old = s.state
        s.state = (old * 6364136223846793005 + s.inc) & M
        xs = (((old >> 18) ^ old) >> 27) & 0xffffffff
        rot = old >> 59
        return ((xs >> rot) | (xs << ((32 - rot) & 31))) & 0xffffffff
    def below(s, bound):
        m = s.next() * bound; low = m & 0xffffffff
        if low < bound:
            t = (1 << 32) % bound
            while low < t:
                m = s.next() * bound; low = m & 0xffffffff
        return m >> 32
def perm(n, seed, epoch):
    o = list(range(n)); r = Pcg(splitmix64(seed ^ splitmix64(epoch)), epoch)
    for i in range(n - 1, 0, -1):
        j = r.below(i + 1); o[i], o[j] = o[j], o[i]
    return o
for seed, epoch in [(1, 0), (1, 1), (42, 7)]:
    print(seed, epoch, perm(12, seed, epoch))
