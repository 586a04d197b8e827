import json, sys, glob, os, re
d = sys.argv[1]
print(open(os.path.join(d,'log')).read())
for c in ('ceil_a.txt','ceil_b.txt'):
    print(c, open(os.path.join(d,c)).read().strip().replace('\n',' | '))
want=[145223,1670,75882,83591,152794,134007,6461,3849]
ph=['kda_matmul','experts','lm_head','shared','mlp','mla_matmul']
for f in sorted(glob.glob(os.path.join(d,'*.json'))):
    j=json.load(open(f)); t=j['timing']; n=t['decode_tokens']
    p=t['decode_phases']
    print('%-18s ids %s  s/tok %.3f  min %.3f  cpu/wall %.2f  ' % (os.path.basename(f), 'OK' if j['generated_ids']==want else 'DIFF', t['decode_s']/n, t['decode_step_min_s'], t['decode_cpu_s']/t['decode_s']) +
          ' '.join('%s %.0f' % (k, 1000*p[k]['wall_s']/n) for k in ph))
