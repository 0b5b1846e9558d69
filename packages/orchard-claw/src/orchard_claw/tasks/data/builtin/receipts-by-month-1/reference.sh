cd /workspace/receipts
mkdir -p 2023-03 && mv scan_1089_01.txt 2023-03/
mkdir -p 2023-03 && mv scan_2245_10.txt 2023-03/
mkdir -p 2023-02 && mv scan_3619_03.txt 2023-02/
mkdir -p 2023-03 && mv scan_3992_07.txt 2023-03/
mkdir -p 2023-02 && mv scan_4024_11.txt 2023-02/
mkdir -p 2023-06 && mv scan_5838_09.txt 2023-06/
mkdir -p 2023-03 && mv scan_5941_05.txt 2023-03/
mkdir -p 2023-06 && mv scan_6383_06.txt 2023-06/
mkdir -p 2023-02 && mv scan_6460_08.txt 2023-02/
mkdir -p 2023-06 && mv scan_7425_04.txt 2023-06/
mkdir -p 2023-02 && mv scan_9095_00.txt 2023-02/
mkdir -p 2023-06 && mv scan_9491_02.txt 2023-06/
mkdir -p .
cat > index.csv <<'ORCHARD_EOF'
month,count,total
2023-02,4,255.31
2023-03,4,261.28
2023-06,4,221.38
ORCHARD_EOF
